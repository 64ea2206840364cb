"""Analyses of streams and replays: regime, gap decomposition, permutation ablation,
static identity, concentration, absolute traffic (evaluation paper §6, §7, §9; CLR Fig. 2-3)."""

from .alignment import AlignmentRow, GridPoint, align, reference_frame_r_null, regime_grid
from .concentration import ConcentrationStats, concentration, gate_mass_by_rank
from .gap import GapResult, gap_decomposition
from .locality import LocalityStats, routing_locality
from .permutation import PermutationResult, permutation_ablation, permute_steps
from .regime import RegimeStats, expected_union_null, regime_stats
from .static import access_histogram, access_share_table, static_misses_from_histogram
from .traffic import (
    REFERENCE_FRAME,
    ReplayBytes,
    TrafficReading,
    output_tokens,
    recorded_block_bytes,
    replay_bytes,
    traffic_reading,
)

__all__ = [
    "RegimeStats", "regime_stats", "expected_union_null",
    "GapResult", "gap_decomposition",
    "PermutationResult", "permute_steps", "permutation_ablation",
    "access_histogram", "access_share_table", "static_misses_from_histogram",
    "ConcentrationStats", "concentration", "gate_mass_by_rank",
    "TrafficReading", "traffic_reading", "REFERENCE_FRAME",
    "output_tokens", "recorded_block_bytes", "ReplayBytes", "replay_bytes",
    "GridPoint", "AlignmentRow", "regime_grid", "align", "reference_frame_r_null",
    "LocalityStats", "routing_locality",
]
