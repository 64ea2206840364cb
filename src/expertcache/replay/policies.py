"""The policy registry: names from the literature mapped onto engine keys (§2.3).

A policy scores; the engine decides and counts. Dynamic policies are one key
code of :mod:`._kernels` plus one :func:`register_policy` line here. Static
policies have no key: the engine pins a set and never changes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ValidationError
from . import keys as K

__all__ = ["Policy", "register_policy", "get_policy", "policy_names", "POLICIES"]


@dataclass(frozen=True)
class Policy:
    """A registered replay policy.

    Attributes
    ----------
    name
        Registry name (CLI choice).
    kind
        ``"dynamic"`` (a key over candidates), ``"static"`` (pinned set) or ``"demand"`` (no cache).
    key_code
        Kernel key code for dynamic policies (and ``demand``, which runs at capacity 0).
    needs_next_use
        Whether the key reads the oracle next-use array.
    needs_calibration
        Whether a calibration stream must be supplied (``static``).
    needs_advice
        Whether its key reads advice produced offline by a predictor (docs/design.md §1).
    causal
        Whether the policy uses only past information (eligible as "best causal", §7.1).
    loop
        Which engine loop replays it: ``"list"`` (recency list, LRU order), ``"belady"``
        (int64 next-use heap), ``"heap"`` (generic key heap, keys that change only on
        access), ``"scan"`` (re-rank every candidate; drifting keys) or ``"static"``.
        All make the same decision for a given key (docs/performance.md).
    stack
        Whether its ranking at each unit boundary is independent of the capacity, so that
        caches of all capacities are nested (Mattson's stack property): one pass gives
        every capacity (:func:`expertcache.replay.replay_curve`).
    description
        One line for help texts and reports.
    """

    name: str
    kind: str
    key_code: int
    needs_next_use: bool = False
    needs_calibration: bool = False
    needs_advice: bool = False
    causal: bool = True
    stack: bool = False
    loop: str = "heap"
    description: str = ""


POLICIES: dict[str, Policy] = {}


def register_policy(policy: Policy) -> Policy:
    """Add ``policy`` to the registry; a duplicate name raises ``ValueError``."""
    if policy.name in POLICIES:
        raise ValueError(f"policy {policy.name!r} is already registered")
    POLICIES[policy.name] = policy
    return policy


def get_policy(name: str) -> Policy:
    """Look a policy up by name, with a helpful error listing the choices."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValidationError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}",
                              field="policy") from None


def policy_names(advice: bool = True) -> tuple[str, ...]:
    """Registered policy names, in registration order (``advice=False``: those that need no predictor)."""
    return tuple(n for n, p in POLICIES.items() if advice or not p.needs_advice)


register_policy(Policy("demand", "demand", K.KEY_LRU, loop="list", description="no cache: every union access transfers"))
register_policy(Policy("static", "static", -1, needs_calibration=True, loop="static",
                       description="top-c experts per layer of a calibration stream, pinned"))
register_policy(Policy("static-same-trace", "static", -1, causal=False, loop="static",
                       description="static pinned set fitted on the replayed stream (diagnostic only)"))
register_policy(Policy("lru", "dynamic", K.KEY_LRU, stack=True, loop="list", description="least recently used (event clock)"))
register_policy(Policy("lfu", "dynamic", K.KEY_LFU, stack=True, description="least frequently used"))
register_policy(Policy("lfru", "dynamic", K.KEY_LFRU, stack=True, loop="scan", description="frequency / age"))
register_policy(Policy("lrfu", "dynamic", K.KEY_LRFU, stack=True,
                       description="LRFU (Lee et al.): decayed recency-frequency, lambda = ReplayConfig.lrfu_lambda"))
register_policy(Policy("least-stale", "dynamic", K.KEY_LEAST_STALE, stack=True,
                       description="SpecMD least-stale: untouched in the current cycle first"))
register_policy(Policy("belady", "dynamic", K.KEY_BELADY, needs_next_use=True, causal=False, stack=True,
                       loop="belady",
                       description="offline optimum with bypass admission"))
register_policy(Policy("belady-forced", "dynamic", K.KEY_BELADY_FORCED, needs_next_use=True, causal=False,
                       loop="belady",
                       description="Belady that must admit every miss (gap decomposition probe)"))
register_policy(Policy("predicted-next-use", "dynamic", K.KEY_BELADY, needs_advice=True, loop="belady",
                       description="Belady's machinery on predicted next uses (advice; §7.3)"))
