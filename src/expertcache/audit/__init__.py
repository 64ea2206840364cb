"""Contamination audit (§5, B1–B8): route-side diagnostics, matched-pair attribution, workload
locality against a size-matched reference, controls, and the reporting block's workload fields.

Imports numpy, numba and pyarrow only (through the trace, events and replay modules).
"""

from .bands import band_reductions, round_robin, union_ratio_by_band
from .block import NOT_REPORTED, WORKLOAD_FIELDS, workload_block
from .controls import ControlResult, inject_shared_prefix, positive_control
from .locality import (
    VERDICTS,
    CategoryLocality,
    DrawComparison,
    LocalityConfig,
    LocalityResult,
    compare_draws,
    workload_locality,
)
from .matched import Arms, MatchedAttribution, MatchedRow, matched_attribution, read_arms
from .routes import CategoryRoutes, PairStats, RouteAudit, RouteAuditConfig, pair_stats, route_audit
from .view import DEFAULT_BANDS, Band, DecodeView, decode_view, parse_bands

__all__ = [
    "band_reductions", "round_robin", "union_ratio_by_band",
    "NOT_REPORTED", "WORKLOAD_FIELDS", "workload_block",
    "ControlResult", "inject_shared_prefix", "positive_control",
    "VERDICTS", "CategoryLocality", "LocalityConfig", "LocalityResult", "workload_locality",
    "DrawComparison", "compare_draws",
    "Arms", "MatchedAttribution", "MatchedRow", "matched_attribution", "read_arms",
    "CategoryRoutes", "PairStats", "RouteAudit", "RouteAuditConfig", "pair_stats", "route_audit",
    "DEFAULT_BANDS", "Band", "DecodeView", "decode_view", "parse_bands",
]
