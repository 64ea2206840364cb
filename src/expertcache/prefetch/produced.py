"""What an advice producer returns: the advice plus how it is to be replayed and what it costs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..nextuse.advice import Advice
from ..trace import RoutingTrace

__all__ = ["Produced", "multi_hot", "request_rows"]


@dataclass(frozen=True)
class Produced:
    """One baseline's advice and its replay settings.

    Attributes
    ----------
    advice
        Event-level arrays (``None`` for update-only base policies).
    priority
        Retention key of the replay (``lru``, ``lfu``, ``lrfu``, or ``advice`` for ``U_B``).
    prefetch
        Whether the replay runs pre-access refinement on ``advice.prefetch_score``.
    added_params
        New inference-time model parameters (CLR Table 1 counts only these).
    store_entries
        Entries of an external store (activation matrices, expert maps); not parameters.
    availability
        Decision availability (CLR Table 1): when every input of the decision is ready.
    note
        How this re-expression differs from the original system, in one line.
    details
        Producer-specific facts (feature kind, fitted sizes) for the JSON output.
    """

    advice: Advice | None
    priority: str
    prefetch: bool
    added_params: int = 0
    store_entries: int = 0
    availability: str = ""
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def multi_hot(experts: np.ndarray, n_experts: int) -> np.ndarray:
    """``float32[n, N]`` with ones at the expert ids of each row of ``experts`` (``int[n, k]``)."""
    out = np.zeros((experts.shape[0], n_experts), dtype=np.float32)
    np.put_along_axis(out, experts.astype(np.int64), 1.0, axis=1)
    return out


def request_rows(trace: RoutingTrace, indices) -> np.ndarray:
    """Row indices of ``trace`` kept by ``select_requests(trace, indices)``, in its order (to slice hidden states)."""
    return np.concatenate([np.flatnonzero(trace.request == int(i)) for i in indices])
