"""Prefetch and activation-aware baselines as trace-driven advice (issue 9; CLR §1, §4.1, Table 1).

Each baseline is a producer of :class:`expertcache.nextuse.Advice` (retention
priorities and/or pre-access candidates) plus a retention key, replayed by
:func:`expertcache.replay.proactive.replay_proactive` under one charging rule:
every demand miss and every proactive insertion is one full expert transfer.
See docs/prefetch.md.

Public API (loaded on first use)
--------------------------------
advice_context(trace, batch, prefill_init)   replayed stream + token -> event map
activation_aware(ctx, calibration)           MoE-Infinity-style EAM matching
lookahead(ctx, calibration, distance)        ProMoE-style predictor l -> l + d (fit_lookahead)
expert_map_search(ctx, calibration)          FineMoE-style expert-map store
option_set(stream, option_steps, source)     Temporally-Extended-MoE-style option sets
next_true(stream)                            the oracle prefetcher (reference)
compare(source, CompareConfig)               the CLR Table 1 comparison (plot_compare for the figure)
"""

from __future__ import annotations

from typing import Any

_WHERE = {
    "AdviceContext": "context", "advice_context": "context",
    "activation_aware": "activation", "request_eams": "activation",
    "LookaheadPredictor": "predictor", "fit_lookahead": "predictor", "lookahead": "predictor",
    "expert_map_search": "expert_map", "semantic_embeddings": "expert_map", "prompt_vectors": "expert_map",
    "semantic_similarity": "expert_map",
    "option_set": "options", "next_true": "options",
    "Produced": "produced",
    "BASELINES": "comparison", "CompareConfig": "comparison", "CompareRow": "comparison",
    "CompareReport": "comparison",
    "compare": "comparison", "plot_compare": "comparison", "split_trace": "comparison",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
