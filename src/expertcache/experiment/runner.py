"""Running a spec: pending conditions grouped into tasks, executed locally or on Ray, stored in chunks.

Conditions that share an event stream (input, selection, order seed, warm-up,
discipline, batch, offsets) form one task, so each stream is built once per
task; inside a task, conditions that differ only in ``rho`` are one
:func:`expertcache.replay.replay_curve` call (one pass for stack policies).
Every replay is a pure function of its condition, so the executor, the number
of workers and the completion order never change a result; the consolidated
table is written in condition order.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ValidationError
from .spec import ExperimentSpec, PlannedCondition, expand
from .tasks import METRICS, plan_tasks

__all__ = ["RunReport", "run_spec"]


@dataclass(frozen=True)
class RunReport:
    """What one :func:`run_spec` call did.

    Attributes
    ----------
    n_conditions
        Conditions in the spec.
    n_skipped
        Already stored with the same hash (not recomputed).
    ran
        IDs of the conditions computed by this call, in plan order.
    seconds
        Wall time of the call.
    complete
        Whether every condition now has a stored result (the table was consolidated).
    """

    n_conditions: int
    n_skipped: int
    ran: tuple[str, ...]
    seconds: float
    complete: bool
    store: str = ""
    executor: str = "local"
    jobs: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def conditions_per_minute(self) -> float:
        return 60.0 * len(self.ran) / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"n_conditions": self.n_conditions, "n_skipped": self.n_skipped, "n_ran": len(self.ran),
                "seconds": self.seconds, "conditions_per_minute": self.conditions_per_minute,
                "complete": self.complete, "store": self.store, "executor": self.executor, "jobs": self.jobs}


# ----------------------------------------------------------------------------- driver
def _rows(p: PlannedCondition, values: tuple[float, ...]) -> list[dict[str, Any]]:
    base = {"condition_id": p.condition_id, "condition_hash": p.condition_hash, **p.condition.params()}
    return [{**base, "metric": m, "value": v} for m, v in zip(METRICS, values, strict=False)]


def run_spec(spec: ExperimentSpec, store: str | Path, executor: str = "local", jobs: int = 1,
             address: str | None = None, progress: Callable[[int, int], None] | None = None,
             flush_seconds: float = 2.0, flush_conditions: int = 512, task_conditions: int = 64) -> RunReport:
    """Run every condition of ``spec`` that ``store`` does not hold with the same hash.

    Parameters
    ----------
    spec
        The experiment (:func:`expertcache.experiment.load_spec`).
    store
        Result store directory (created if missing).
    executor
        ``"local"`` (worker processes; ``jobs=1`` runs in this process) or ``"ray"``.
    jobs
        Local worker processes, or CPUs of a local Ray instance (on a Ray cluster the report gives the
        cluster's CPUs instead).
    address
        Ray cluster address (``auto``, ``HOST:6379`` or ``ray://HOST:10001``); ``None`` reads the
        ``RAY_ADDRESS`` environment variable and, without it, starts a local instance.
    progress
        Called as ``progress(done, pending)`` after each task; it may raise (e.g. ``KeyboardInterrupt``)
        to stop the run: results received so far are stored first.
    flush_seconds, flush_conditions
        A chunk is written when either bound is reached since the last one (and at every exit).
    task_conditions
        Upper bound on conditions per task.

    Returns
    -------
    RunReport
    """
    from .store import ResultStore

    t0 = time.perf_counter()
    planned = expand(spec)
    by_id = {p.condition_id: p for p in planned}
    new_store = not (Path(store).exists() or Path(store).is_symlink())
    st = ResultStore.open(store, create=True)
    try:
        report = _run(spec, st, planned, by_id, executor, jobs, address, progress, flush_seconds,
                      flush_conditions, task_conditions)
    except BaseException:
        if new_store and not st.part_files():   # nothing was stored: leave no empty, incomplete store behind
            shutil.rmtree(st.path, ignore_errors=True)
        raise
    return RunReport(report.n_conditions, report.n_skipped, report.ran, time.perf_counter() - t0, True,
                     str(store), executor, report.jobs)


def _run(spec: ExperimentSpec, st: Any, planned: list[PlannedCondition], by_id: dict[str, PlannedCondition],
         executor: str, jobs: int, address: str | None, progress: Callable[[int, int], None] | None,
         flush_seconds: float, flush_conditions: int, task_conditions: int) -> RunReport:
    """The body of :func:`run_spec` on an opened store (times and paths are filled in by the caller)."""
    from .executors import make_executor

    with st.lock():
        st.clean_temporaries()
        previous = st.read_meta().get("spec_name")
        if previous and spec.name and previous != spec.name:
            raise ValidationError(f"this store holds experiment {previous!r}, not {spec.name!r}; a store keeps one "
                                  "spec's results (a complete run drops conditions not in the spec): use another "
                                  "--store", source=str(st.path))
        done = st.done_pairs()
        pending = [p for p in planned if (p.condition_id, p.condition_hash) not in done]
        tasks = plan_tasks(pending, task_conditions)
        meta = {"spec_name": spec.name, "spec_source": spec.source, "spec_sha256": spec.text_sha256,
                "n_conditions": len(planned), "complete": False}
        st.write_meta(meta)
        ran: list[str] = []
        buffer: list[dict[str, Any]] = []
        last_flush = time.monotonic()
        n_buffered = 0
        if progress is not None:
            progress(0, len(pending))
        try:
            if tasks:
                with make_executor(executor, jobs, spec.context(), address) as ex:
                    jobs = ex.jobs      # a Ray cluster's CPUs
                    for result in ex.imap_unordered(tasks):
                        for cid, values in result:
                            buffer.extend(_rows(by_id[cid], values))
                            ran.append(cid)
                        n_buffered += len(result)
                        if n_buffered >= flush_conditions or time.monotonic() - last_flush >= flush_seconds:
                            st.write_part(buffer)
                            buffer, n_buffered, last_flush = [], 0, time.monotonic()
                        if progress is not None:
                            progress(len(ran), len(pending))
        finally:
            st.write_part(buffer)   # whatever ended the loop, received results are kept
        st.consolidate(planned, {**meta, "complete": True})
    order = {p.condition_id: i for i, p in enumerate(planned)}
    return RunReport(len(planned), len(planned) - len(pending), tuple(sorted(ran, key=order.__getitem__)),
                     0.0, True, "", executor, jobs)
