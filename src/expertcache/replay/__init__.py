"""Event-atomic and sequential replay of event streams against expert caches (§2, §4).

The registry and result records load instantly; the engine (and numba) load
on first use of :func:`replay` or another engine name.
"""

from __future__ import annotations

from typing import Any

from .policies import POLICIES, Policy, get_policy, policy_names, register_policy, unregister_policy
from .result import LayerCounts, ReplayResult, results_to_arrow, results_to_pandas

_ENGINE = ("ReplayConfig", "replay", "replay_hits", "replay_curve", "one_pass_supported", "curve_pays", "capacities_for_rho", "total_capacity", "SEMANTICS", "SCOPES", "TIE_BREAKS",
           "static_pinned_set")

__all__ = ["POLICIES", "Policy", "get_policy", "policy_names", "register_policy", "unregister_policy", "LayerCounts", "ReplayResult",
           "results_to_arrow", "results_to_pandas",
           "sweep", "default_jobs", *_ENGINE]


def __getattr__(name: str) -> Any:
    if name in ("sweep", "default_jobs"):
        from . import sweeps as _sweeps

        return getattr(_sweeps, name)
    if name in _ENGINE:
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
