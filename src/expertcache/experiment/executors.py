"""Executors: where tasks run. Local worker processes by default; Ray when sweeps outgrow one machine.

Both yield each task's result as it completes; the runner stores results by
condition ID, so completion order never changes the table. Ray is imported
only when ``executor="ray"`` is asked for (the optional ``ray`` extra).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from ..errors import ExpertCacheError, ValidationError
from .tasks import Task, run_task

__all__ = ["EXECUTORS", "LocalExecutor", "RayExecutor", "make_executor"]

EXECUTORS = ("local", "ray")

_CONTEXT: dict[str, Any] = {}


def _die_with_parent(parent_pid: int) -> None:
    """Make this worker process end when ``parent_pid`` (the run) ends, however it ends.

    On Linux the kernel sends SIGKILL on the parent's death (``prctl(PR_SET_PDEATHSIG)``); everywhere a
    daemon thread also polls the parent and exits when it is gone. A killed ``spec run`` therefore
    leaves no orphaned worker behind (that could hold files open or keep computing).
    """
    import signal
    import sys
    import threading
    import time

    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)      # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            pass
    ppid = os.getppid()          # the run itself (fork, spawn) or a fork server started by it

    def gone() -> bool:
        if os.getppid() != ppid:
            return True
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False

    if gone():                  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if gone():
                os._exit(1)

    threading.Thread(target=watch, name="expertcache-parent-watch", daemon=True).start()


def _init_worker(context: dict[str, Any], parent_pid: int | None = None) -> None:
    if parent_pid is not None:
        _die_with_parent(parent_pid)
    _CONTEXT["context"] = context


def _run_in_worker(task: Task) -> list:
    return run_task(_CONTEXT["context"], task)


class LocalExecutor:
    """``jobs`` worker processes (``jobs == 1``: in this process, no pool)."""

    def __init__(self, jobs: int, context: dict[str, Any]) -> None:
        self.jobs = max(1, int(jobs))
        self.context = context
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> LocalExecutor:
        if self.jobs > 1:
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, initializer=_init_worker,
                                             initargs=(self.context, os.getpid()))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._pool is not None:
            # on an interruption, do not wait for queued tasks: their conditions are simply not stored
            self._pool.shutdown(wait=exc_type is None, cancel_futures=True)
            self._pool = None

    def imap_unordered(self, tasks: Sequence[Task]) -> Iterator[list]:
        if self._pool is None:
            for task in tasks:
                yield run_task(self.context, task)
            return
        # keep a bounded window in flight, so an interruption abandons little work
        todo = list(reversed(tasks))
        running = set()
        window = 4 * self.jobs
        while todo or running:
            while todo and len(running) < window:
                running.add(self._pool.submit(_run_in_worker, todo.pop()))
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                yield fut.result()


def _ray_task(context: dict[str, Any], task: Task) -> list:
    return run_task(context, task)


class RayExecutor:
    """Tasks as Ray remote functions: on a local instance (``num_cpus=jobs``) or on an existing cluster.

    The cluster is ``address`` when given (``auto``: the one ``ray start --head`` started on this machine,
    ``HOST:6379`` or ``ray://HOST:10001``), else the ``RAY_ADDRESS`` environment variable, as Ray's own
    tools read it; with neither, a local instance of ``jobs`` CPUs is started and shut down afterwards.
    On a cluster ``jobs`` becomes the cluster's CPU count once connected. Every Ray worker must be able
    to import this version of expertcache (``pip install expertcache[ray]`` on each node) and read the
    spec's input paths (a shared filesystem).
    """

    def __init__(self, jobs: int, context: dict[str, Any], address: str | None = None) -> None:
        self.jobs = max(1, int(jobs))
        self.context = context
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.source = "--address" if address else "RAY_ADDRESS"
        self._started = False

    def __enter__(self) -> RayExecutor:
        ray = _import_ray()
        self._ray = ray
        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            try:
                if self.address:
                    ray.init(address=self.address, log_to_driver=False)
                else:
                    ray.init(num_cpus=self.jobs, include_dashboard=False, log_to_driver=False)
            except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError, ...
                raise ValidationError(_unreachable(self.address, self.source, exc), field="address") from None
            self._started = True
        if self.address or not self._started:      # a cluster (or a session the caller opened): its CPUs
            try:
                cpus = int(ray.cluster_resources().get("CPU", 0))
            except Exception:  # noqa: BLE001 - the job count is informative only
                cpus = 0
            self.jobs = max(1, cpus)
        self._remote = ray.remote(_ray_task)
        self._context_ref = ray.put(self.context)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        ray = self._ray
        for ref in getattr(self, "_pending", ()):
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - already finished or gone
                pass
        if self._started:
            ray.shutdown()

    def imap_unordered(self, tasks: Sequence[Task]) -> Iterator[list]:
        ray = self._ray
        todo = list(reversed(tasks))
        window = 4 * self.jobs if not self.address else max(64, 4 * self.jobs)
        self._pending: list = []
        while todo or self._pending:
            while todo and len(self._pending) < window:
                self._pending.append(self._remote.remote(self._context_ref, todo.pop()))
            ready, self._pending = ray.wait(self._pending, num_returns=1)
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, ExpertCacheError):   # a user error: its one line, not Ray's traceback
                    raise cause from None
                raise
            yield result


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ValidationError("the ray executor needs Ray: pip install 'expertcache[ray]'",
                              field="executor") from None
    return ray


def _unreachable(address: str | None, source: str, exc: BaseException) -> str:
    """One line for a Ray cluster that could not be reached (or a local instance that did not start)."""
    lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
    why = (lines[0] if lines else type(exc).__name__)[:200]
    if address:
        auth = ""
        if "RAY_AUTH_MODE" not in os.environ and (Path.home() / ".ray" / "auth_token").is_file():
            auth = "; a cluster with token authentication also needs RAY_AUTH_MODE=token here"
        return (f"cannot reach the Ray cluster at {address!r} (from {source}): {why}; start one with "
                f"`ray start --head`, or fix or unset the address{auth} (docs/experiments.md)")
    return f"cannot start a local Ray instance: {why}"


def make_executor(name: str, jobs: int, context: dict[str, Any], address: str | None = None):
    """The executor called ``name`` (:data:`EXECUTORS`)."""
    if name == "local":
        if address:
            raise ValidationError("--address applies to the ray executor only", field="address")
        return LocalExecutor(jobs, context)
    if name == "ray":
        return RayExecutor(jobs, context, address)
    raise ValidationError(f"executor must be one of {', '.join(EXECUTORS)}; got {name!r}", field="executor")
