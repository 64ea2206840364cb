"""Event-atomic and sequential replay of event streams against expert caches (§2, §4)."""

from .engine import (
    SCOPES,
    SEMANTICS,
    TIE_BREAKS,
    ReplayConfig,
    capacities_for_rho,
    replay,
    total_capacity,
)
from .policies import POLICIES, Policy, get_policy, policy_names, register_policy
from .result import LayerCounts, ReplayResult

__all__ = [
    "ReplayConfig", "ReplayResult", "LayerCounts", "replay", "capacities_for_rho", "total_capacity",
    "SEMANTICS", "SCOPES", "TIE_BREAKS", "POLICIES", "Policy", "get_policy", "policy_names", "register_policy",
]
