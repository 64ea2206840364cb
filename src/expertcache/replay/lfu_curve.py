"""LFU's miss-ratio curve in one pass, by ranks among the seen blocks (:mod:`._kernels_lfu`).

:func:`lfu_curve` returns exactly what :func:`expertcache.replay.replay_curve` returns for ``lfu``
(``tests/test_lfu_curve.py`` checks it against separate replays and the naive twin) at a fraction of the
generic one-pass cost; the spec runner uses it for ``lfu`` conditions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..events import EventStream
from .engine import (
    ReplayConfig,
    _curve_results,
    _fields,
    _member_order,
    _tie_ranks,
    capacities_for_rho,
    one_pass_supported,
)
from .result import ReplayResult

__all__ = ["lfu_curve", "lfu_curve_supported"]


def lfu_curve_supported(config: ReplayConfig) -> bool:
    """Whether :func:`lfu_curve` applies: ``lfu`` with persistent counters where a one-pass curve is defined."""
    return config.policy == "lfu" and one_pass_supported(config)


def lfu_curve(stream: EventStream, config: ReplayConfig, rhos: Sequence[float]) -> tuple[ReplayResult, ...]:
    """:func:`expertcache.replay.replay_curve` for ``lfu`` (``config.rho`` is ignored), one result per ``rho``.

    Raises ``ValueError`` for a configuration :func:`lfu_curve_supported` refuses.
    """
    if not lfu_curve_supported(config):
        raise ValueError("lfu_curve needs policy 'lfu' with persistent counters, per-layer scope, no warm-up")
    from ._kernels_lfu import lfu_stack_depths

    configs = [ReplayConfig(**{**_fields(config), "rho": float(r), "capacity": None}) for r in rhos]
    if not configs:
        return ()
    L, N = stream.n_layers, stream.n_experts
    caps = np.stack([capacities_for_rho(c.rho, L, N) for c in configs])       # (n_rho, L)
    depth_cap = int(min(caps.max(), N))
    hist = np.zeros((L, depth_cap + 1), dtype=np.int64)
    tie = _tie_ranks(config.tie_break, int(config.seed), L * N)
    atomic = config.semantics == "event-atomic"
    expert = _member_order(stream, config.semantics, int(config.seed))   # as stored unless sequential-random
    lfu_stack_depths(stream.offsets, expert, stream.layer, N, L, atomic, depth_cap, tie, hist)
    return _curve_results(stream, configs, caps, hist)
