"""Timing metrics of a spec run: every condition's replay put on a timeline under the spec's hardware profile.

A spec with a ``[timing]`` table (docs/experiments.md)::

    [timing]
    profile = "pcie-gen4-x16"      # a built-in profile, or a profile JSON (relative to the spec)
    expert_bytes = 98304           # optional: else the profile's, else what each input records
    metrics = ["tpot_mean_s", "tpot_p99_s", "tokens_per_s", "stall_share"]   # optional: default all

stores, beside the counts of every condition, the metrics :func:`expertcache.timing.simulate` reports for the
same replay (``event-atomic`` conditions under the fused contract, ``sequential-ascending`` ones under the
serialized one). The profile's content (not its file name) and the block size enter every condition's hash, so a
changed profile recomputes the conditions and an unchanged one does not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ValidationError

__all__ = ["TIMING_METRICS", "TimingSpec", "parse_timing", "timing_values"]

#: Timing metrics a spec may store (the names of ``expertcache timing --json``), in table order.
TIMING_METRICS = ("time_s", "tpot_mean_s", "tpot_p50_s", "tpot_p99_s", "tokens_per_s", "stall_s", "stall_share",
                  "link_busy_share", "bytes_per_token")
_CONTRACT = {"event-atomic": "fused", "sequential-ascending": "serialized"}


@dataclass(frozen=True)
class TimingSpec:
    """The ``[timing]`` table of a spec.

    Attributes
    ----------
    profile
        The hardware profile as a dict (:meth:`expertcache.timing.HardwareProfile.to_dict`): its content, so
        workers need no file and the condition hash follows the figures.
    expert_bytes
        Bytes per expert block, or ``None`` (the profile's, else each input's recorded size).
    metrics
        The timing metrics stored, a subset of :data:`TIMING_METRICS` in its order.
    """

    profile: tuple[tuple[str, Any], ...]
    expert_bytes: int | None
    metrics: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (part of the workers' context and of every condition hash)."""
        return {"profile": dict(self.profile), "expert_bytes": self.expert_bytes, "metrics": list(self.metrics)}


def parse_timing(tbl: Any, base_dir: Path, source: str, input_paths: list[str]) -> TimingSpec:
    """Validate a ``[timing]`` table; a block size must be known for every input (``input_paths``)."""
    from ..timing import PROFILES, load_profile

    if not isinstance(tbl, dict):
        raise ValidationError("expected a table", source=source, field="timing")
    bad = set(tbl) - {"profile", "expert_bytes", "metrics"}
    if bad:
        raise ValidationError(f"unknown key(s) {sorted(bad)}; expected profile, expert_bytes, metrics",
                              source=source, field="timing")
    name = tbl.get("profile")
    if not isinstance(name, str) or not name:
        raise ValidationError("[timing] needs profile = \"NAME\" (a built-in profile) or a profile JSON path",
                              source=source, field="timing.profile")
    path = name if name in PROFILES or Path(name).is_absolute() else str(base_dir / name)
    try:
        profile = load_profile(path)
    except ValidationError as exc:
        raise ValidationError(f"{name}: {exc.detail}", source=source, field="timing.profile") from None
    nbytes = tbl.get("expert_bytes")
    if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1):
        raise ValidationError(f"expert_bytes must be a positive integer; got {nbytes!r}", source=source,
                              field="timing.expert_bytes")
    metrics = tbl.get("metrics", list(TIMING_METRICS))
    if not isinstance(metrics, list) or not metrics or any(m not in TIMING_METRICS for m in metrics):
        raise ValidationError(f"metrics must list some of {', '.join(TIMING_METRICS)}; got {metrics!r}",
                              source=source, field="timing.metrics")
    if nbytes is None and profile.expert_bytes is None:
        for p in input_paths:
            if _recorded_bytes(p) is None:
                raise ValidationError(f"the expert block size is unknown for input {p} (its manifest records no "
                                      "expert_block_bytes): give [timing] expert_bytes = BYTES", source=source,
                                      field="timing.expert_bytes")
    ordered = tuple(m for m in TIMING_METRICS if m in metrics)
    return TimingSpec(tuple(sorted(profile.to_dict().items())), nbytes, ordered)


def _recorded_bytes(directory: str) -> int | None:
    from ..storage import MANIFEST

    try:
        prov = json.loads((Path(directory) / MANIFEST).read_text()).get("provenance") or {}
    except (OSError, ValueError, RecursionError, AttributeError):
        return None
    for p in (prov, prov.get("trace_provenance") or {}):
        v = p.get("expert_block_bytes") if isinstance(p, dict) else None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def check_semantics(semantics: str, source: str, where: str) -> None:
    """Timing needs the stream's member order: ``event-atomic`` or ``sequential-ascending``."""
    if semantics not in _CONTRACT:
        raise ValidationError(f"timing metrics need semantics event-atomic (fused) or sequential-ascending "
                              f"(serialized); got {semantics!r}", source=source, field=f"{where}.semantics")


def timing_values(timing: dict[str, Any], stream: Any, config: Any, calibration: Any) -> dict[str, float]:
    """The timing metrics of one condition's replay (``config``: its :class:`ReplayConfig`)."""
    from ..timing import HardwareProfile, simulate

    prof = dict(timing["profile"])
    for k, v in prof.items():
        if isinstance(v, list):
            prof[k] = tuple(v)
    r = simulate(stream, config, HardwareProfile(**prof), contract=_CONTRACT[config.semantics],
                 calibration=calibration, expert_bytes=timing["expert_bytes"])
    d = r.to_dict()
    return {m: float(d[m]) if d[m] is not None else float("nan") for m in timing["metrics"]}
