"""Independent tasks side by side in threads: numba's kernels here release the GIL (``_jit``), and so do numpy's
large operations, so tasks that spend their time there run in parallel without copying their inputs."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any


def default_jobs() -> int:
    """Local cores available to this process."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@contextmanager
def thread_map(jobs: int) -> Iterator[Callable[[Callable[[Any], Any], Iterable[Any]], Iterator[Any]]]:
    """A ``map`` that runs its tasks in a pool of ``jobs`` threads and yields their results in input order (the
    builtin ``map``, one task at a time as results are taken, for ``jobs <= 1``).

    Leaving the scope normally waits for every task given to it. Leaving it by an exception (a task's, raised
    where its result is taken, or an interrupt) cancels the tasks not yet started and waits only for those
    running, so that Ctrl-C or a failure stops the work within one task's time.

    >>> with thread_map(2) as run:
    ...     list(run(lambda x: x * x, range(5)))
    [0, 1, 4, 9, 16]
    """
    if jobs <= 1:
        yield map
        return
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        yield pool.map
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
