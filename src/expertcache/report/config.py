"""What a report measures (:class:`ReportConfig`) and what it holds (:class:`Report`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..analysis import REFERENCE_FRAME
from ..errors import ValidationError
from ..replay import ReplayConfig

__all__ = ["ReportConfig", "Report", "PRESETS"]

#: Named block sizes; figures derived from them are labelled analytical projections.
PRESETS = {"frontier-reference": REFERENCE_FRAME}


@dataclass(frozen=True)
class ReportConfig:
    """What the report measures. Every field is written into the report.

    ``profile`` (a built-in hardware profile name or a profile JSON, docs/timing.md) adds the time section and
    gives §6.6's budget its bandwidth when ``bandwidth_budget`` is not given.
    """

    rho: float = 0.4
    scope: str = "per-layer"
    batch: int = 8
    offsets: str = "zero"
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    rhos: tuple[float, ...] = (0.2, 0.3, 0.4)
    n_permutations: int = 5
    block_bytes: float | None = None
    block_bytes_preset: str | None = None
    target_tokens_per_s: float | None = None
    bandwidth_budget: float | None = None
    profile: str | None = None
    nextuse_model: str | None = None
    labels: str | None = None
    prompts: str | None = None
    jobs: int = 1

    def __post_init__(self) -> None:
        ReplayConfig(rho=self.rho, scope=self.scope)
        if self.batch < 1 or any(b < 1 for b in self.batches):
            raise ValidationError("batch sizes must be >= 1", field="batch")
        if not self.seeds:
            raise ValidationError("at least one tie seed is needed", field="seeds")
        for r in self.rhos:
            ReplayConfig(rho=r)
        if self.n_permutations < 0:
            raise ValidationError("n_permutations must be >= 0", field="n_permutations")
        if self.block_bytes_preset not in (None, *PRESETS):
            raise ValidationError(f"unknown block-bytes preset {self.block_bytes_preset!r}; choose from "
                                  f"{', '.join(PRESETS)}", field="block_bytes_preset")
        if self.block_bytes is not None and self.block_bytes <= 0:
            raise ValidationError(f"block bytes must be > 0; got {self.block_bytes}", field="block_bytes")


@dataclass
class Report:
    """Everything measured, as plain data (``data``) plus the figures' source series."""

    data: dict[str, Any]
    block: str
    figures: dict[str, Any] = field(default_factory=dict)
