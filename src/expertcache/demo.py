"""The main job on the bundled example: Table 2 of the evaluation paper, reproduced in shape (§4.3).

The example trace is synthetic (see :mod:`expertcache.synth`); the demo says so
in its output. It splits the trace by request into a calibration half (even
requests, used to fit the ``static`` pin list) and an evaluation half (odd
requests), schedules the evaluation half under FCFS continuous batching, and
replays every registered policy under each semantics.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import numpy as np

from .analysis.regime import regime_stats
from .events import EventStream, build_events
from .replay import ReplayConfig, ReplayResult, policy_names, replay
from .trace import RoutingTrace, read_trace, select_requests

__all__ = ["DemoRow", "DemoReport", "example_trace", "run_demo", "DEMO_SEMANTICS"]

DEMO_SEMANTICS = ("sequential-ascending", "sequential-random", "event-atomic")


def example_trace() -> RoutingTrace:
    """Load the bundled synthetic example trace (OLMoE-shaped: L=16, N=64, k=8)."""
    ref = resources.files("expertcache") / "data" / "example_trace"
    with resources.as_file(ref) as path:
        return read_trace(path)


@dataclass(frozen=True)
class DemoRow:
    """One policy's effective miss fraction under each semantics, with the inflation over event-atomic."""

    policy: str
    results: dict[str, ReplayResult]

    def miss(self, semantics: str) -> float:
        return self.results[semantics].miss_fraction

    def inflation(self, semantics: str) -> float:
        """Relative inflation ``m_sem / m_event_atomic - 1`` (0 when both are 0)."""
        base = self.miss("event-atomic")
        return self.miss(semantics) / base - 1.0 if base else 0.0


@dataclass(frozen=True)
class DemoReport:
    """Everything the demo prints."""

    rows: tuple[DemoRow, ...]
    stream: EventStream
    calibration: EventStream
    batch: int
    rho: float
    seed: int
    mean_ratio: float
    frac_over: float

    def to_dict(self) -> dict:
        return {
            "data": "synthetic example trace (expertcache.synth, OLMoE-shaped); not a real model's routing",
            "batch": self.batch, "rho": self.rho, "seed": self.seed, "scope": "per-layer",
            "n_events": self.stream.n_events, "union": self.stream.union, "logical": self.stream.logical,
            "mean_event_ratio": self.mean_ratio, "fraction_events_over_capacity": self.frac_over,
            "rows": [
                {"policy": r.policy,
                 **{f"miss_fraction_{s}": r.miss(s) for s in DEMO_SEMANTICS},
                 **{f"inflation_{s}": r.inflation(s) for s in DEMO_SEMANTICS if s != "event-atomic"}}
                for r in self.rows
            ],
        }


def run_demo(batch: int = 8, rho: float = 0.4, seed: int = 0, progress=None) -> DemoReport:
    """Replay the bundled example at concurrency ``batch`` and residency ``rho`` for every policy.

    ``progress``, if given, is called once per finished replay with the total count.
    """
    trace = example_trace()
    idx = np.arange(trace.n_requests)
    calib = build_events(select_requests(trace, idx[0::2], "even requests (calibration)"), batch)
    stream = build_events(select_requests(trace, idx[1::2], "odd requests (evaluation)"), batch)
    regime = regime_stats(stream, rho)
    rows = []
    names = policy_names(advice=False)
    total = len(names) * len(DEMO_SEMANTICS)
    for name in names:
        results = {}
        for sem in DEMO_SEMANTICS:
            cfg = ReplayConfig(policy=name, rho=rho, semantics=sem, seed=seed)
            results[sem] = replay(stream, cfg, calibration=calib)
            if progress is not None:
                progress(total)
        rows.append(DemoRow(name, results))
    return DemoReport(tuple(rows), stream, calib, batch, rho, seed, regime.r_mean, regime.r_fraction_over_1)
