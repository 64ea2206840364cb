"""Sweeps: many replay configurations over one stream, curves in one pass, on all local cores.

Configurations that differ only in ``rho`` form one task, answered by
:func:`replay_curve` (one pass for stack policies). Tasks run in worker
processes when ``jobs > 1``; results come back in the order of the input
configurations and are identical to a serial run (every replay is a pure
function of its stream, configuration and seed). The tasks of a process (this
one, or each worker) share what :func:`.engine.reuse_belady_inputs` keeps:
sequential-random's shuffled member order of a seed is made once there, as
are Belady's next uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

from .._threads import default_jobs
from ..events import EventStream
from .engine import ReplayConfig, replay_curve, reuse_belady_inputs
from .result import ReplayResult

__all__ = ["sweep", "default_jobs"]

_STATE: dict[str, EventStream | None] = {}


def _init(stream: EventStream, calibration: EventStream | None, advice=None) -> None:
    _STATE["stream"] = stream
    _STATE["calibration"] = calibration
    _STATE["advice"] = advice


#: A worker process's open :func:`.engine.reuse_belady_inputs` scope, held so that it stays open (a scope object no
#: longer referenced would be collected, and its generator closed, at once).
_WORKER_SCOPE: list = []


def _init_worker(stream: EventStream, calibration: EventStream | None, advice=None) -> None:
    """:func:`_init` in a worker process, which then keeps what :func:`.engine.reuse_belady_inputs` keeps for all
    its tasks (the scope closes with the process)."""
    _init(stream, calibration, advice)
    if not _WORKER_SCOPE:
        scope = reuse_belady_inputs()
        scope.__enter__()
        _WORKER_SCOPE.append(scope)


def _run(base: ReplayConfig, rhos: list[float]) -> tuple[ReplayResult, ...]:
    return replay_curve(_STATE["stream"], base, rhos, _STATE["calibration"], _STATE["advice"])


def _tasks(configs: Sequence[ReplayConfig]) -> list[tuple[ReplayConfig, list[float], list[int]]]:
    """Group configurations that differ only in rho: (base config, rhos, input positions)."""
    groups: dict[ReplayConfig, tuple[list[float], list[int]]] = {}
    out: list[tuple[ReplayConfig, list[float], list[int]]] = []
    for i, cfg in enumerate(configs):
        if cfg.capacity is not None:
            out.append((cfg, [cfg.rho], [i]))  # explicit capacities run alone
            continue
        base = ReplayConfig(**{**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__}, "rho": 0.0})
        rhos, idx = groups.setdefault(base, ([], []))
        rhos.append(cfg.rho)
        idx.append(i)
    return [(base, rhos, idx) for base, (rhos, idx) in groups.items()] + out


def sweep(stream: EventStream, configs: Sequence[ReplayConfig], calibration: EventStream | None = None,
          jobs: int = 1, progress: Callable[[int, int], None] | None = None, advice=None) -> list[ReplayResult]:
    """Replay ``stream`` under every configuration; results in input order.

    Parameters
    ----------
    stream, calibration, advice
        As for :func:`expertcache.replay.replay`.
    configs
        The configurations; those differing only in ``rho`` share one curve pass.
    jobs
        Worker processes (1 = in this process).
    progress
        Called as ``progress(done_tasks, n_tasks)`` after each task.
    """
    tasks = _tasks(configs)
    results: list[ReplayResult | None] = [None] * len(configs)

    def place(task: tuple, res: tuple[ReplayResult, ...], done: int) -> None:
        _, _, idx = task
        for i, r in zip(idx, res, strict=True):
            results[i] = r
        if progress is not None:
            progress(done, len(tasks))

    if jobs <= 1 or len(tasks) <= 1:
        _init(stream, calibration, advice)
        try:
            with reuse_belady_inputs():    # the tasks share a shuffled member order, next uses, event bitsets
                for done, task in enumerate(tasks, start=1):
                    base, rhos, _ = task
                    res = _run(base, rhos) if base.capacity is None else (_replay_one(base),)
                    place(task, res, done)
        finally:
            _STATE.clear()
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), initializer=_init_worker,
                                 initargs=(stream, calibration, advice)) as pool:
            futures = {}
            for task in tasks:
                base, rhos, _ = task
                fut = pool.submit(_run, base, rhos) if base.capacity is None else pool.submit(_replay_one, base)
                futures[fut] = task
            for done, fut in enumerate(as_completed(futures), start=1):
                res = fut.result()
                place(futures[fut], res if isinstance(res, tuple) else (res,), done)
    return [r for r in results if r is not None]


def _replay_one(cfg: ReplayConfig) -> ReplayResult:
    from .engine import replay

    return replay(_STATE["stream"], cfg, _STATE["calibration"], _STATE["advice"])
