"""Independent tasks side by side in threads: numba's kernels here release the GIL (``_jit``), and so do numpy's
large operations, so tasks that spend their time there run in parallel without copying their inputs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any


@contextmanager
def thread_map(jobs: int) -> Iterator[Callable[[Callable[[Any], Any], Iterable[Any]], Iterator[Any]]]:
    """A ``map`` that runs its tasks in a pool of ``jobs`` threads and yields their results in input order (the
    builtin ``map``, one task at a time as results are taken, for ``jobs <= 1``). Leaving the scope waits for
    every task given to it; a task's exception is raised where its result is taken.

    >>> with thread_map(2) as run:
    ...     list(run(lambda x: x * x, range(5)))
    [0, 1, 4, 9, 16]
    """
    if jobs <= 1:
        yield map
        return
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        yield pool.map
