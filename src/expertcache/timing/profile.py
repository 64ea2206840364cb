"""Hardware profiles: what a copy and a computation cost, as the timing model reads them (docs/timing.md).

A profile is a small JSON object. The link moves expert blocks from the host tier to the device tier: each
transfer takes ``latency_s + expert_bytes / bandwidth`` on one of ``copy_streams`` channels that share the
bandwidth (a channel runs at ``bandwidth / copy_streams``), and ``overlap`` says whether transfers run while the
device computes (a GPU's copy engines) or block it (a CPU executor's ``memcpy``). Compute costs are per MoE
layer: a fixed part and a per-token part for the layer's dense work (attention, norms, the router), and a fixed
part and a per-routed-token part for every expert invocation; a forward step adds its own fixed and per-token
costs (embedding, head, sampling). A scalar applies to every layer; a list gives one value per layer.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..storage import atomic_write_bytes, json_text

__all__ = ["HardwareProfile", "PROFILES", "load_profile", "save_profile", "profile_names"]

_PER_LAYER = ("dense_fixed_s", "dense_per_token_s", "expert_fixed_s", "expert_per_token_s")
_MAX_PROFILE_BYTES = 1 << 20


@dataclass(frozen=True)
class HardwareProfile:
    """Costs of the link and of compute, in seconds and bytes per second.

    Attributes
    ----------
    name, source
        What the profile is and where its figures come from (stated in every output).
    bandwidth
        Host-to-device bytes per second of the whole link.
    latency_s
        Fixed cost of one transfer (seconds), on top of ``bytes / channel bandwidth``.
    copy_streams
        Parallel transfer channels; each runs at ``bandwidth / copy_streams``.
    overlap
        Transfers run concurrently with compute (True) or block it (False).
    expert_bytes
        Bytes of one expert block; ``None`` takes the stream's recorded ``expert_block_bytes``.
    dense_fixed_s, dense_per_token_s, expert_fixed_s, expert_per_token_s
        Per-layer compute costs: one value for every layer, or one per MoE layer.
    step_fixed_s, step_per_token_s
        Per forward step (outside the MoE layers).
    measured
        How the figures were obtained: ``"stated"`` (an assumption or a datasheet) or ``"measured"``.
    """

    name: str
    source: str
    bandwidth: float
    latency_s: float = 0.0
    copy_streams: int = 1
    overlap: bool = True
    expert_bytes: int | None = None
    dense_fixed_s: float | tuple[float, ...] = 0.0
    dense_per_token_s: float | tuple[float, ...] = 0.0
    expert_fixed_s: float | tuple[float, ...] = 0.0
    expert_per_token_s: float | tuple[float, ...] = 0.0
    step_fixed_s: float = 0.0
    step_per_token_s: float = 0.0
    measured: str = "stated"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValidationError(f"name must be a non-empty string; got {self.name!r}", field="name")
        if not _finite(self.bandwidth) or self.bandwidth <= 0:
            raise ValidationError(f"bandwidth must be a positive number of bytes/s; got {self.bandwidth!r}",
                                  field="bandwidth")
        for name in ("latency_s", "step_fixed_s", "step_per_token_s"):
            value = getattr(self, name)
            if not _finite(value) or value < 0:
                raise ValidationError(f"{name} must be a finite number >= 0; got {value!r}", field=name)
        if isinstance(self.copy_streams, bool) or not isinstance(self.copy_streams, int) or \
                not 1 <= self.copy_streams <= 1024:
            raise ValidationError(f"copy_streams must be an integer in [1, 1024]; got {self.copy_streams!r}",
                                  field="copy_streams")
        if not isinstance(self.overlap, bool):
            raise ValidationError(f"overlap must be true or false; got {self.overlap!r}", field="overlap")
        if self.expert_bytes is not None and (isinstance(self.expert_bytes, bool) or
                                              not isinstance(self.expert_bytes, int) or self.expert_bytes < 1):
            raise ValidationError(f"expert_bytes must be a positive integer or null; got {self.expert_bytes!r}",
                                  field="expert_bytes")
        for name in _PER_LAYER:
            value = getattr(self, name)
            values = value if isinstance(value, tuple) else (value,)
            if not values or len(values) > 100_000 or any(not _finite(v) or v < 0 for v in values):
                raise ValidationError(f"{name} must be a number >= 0 or a list of them (one per layer); "
                                      f"got {value!r:.80}", field=name)
        if self.measured not in ("stated", "measured"):
            raise ValidationError(f"measured must be 'stated' or 'measured'; got {self.measured!r}",
                                  field="measured")

    def per_layer(self, n_layers: int) -> np.ndarray:
        """``float64[4, n_layers]``: dense fixed, dense per token, expert fixed, expert per token."""
        out = np.empty((4, n_layers), dtype=np.float64)
        for i, name in enumerate(_PER_LAYER):
            value = getattr(self, name)
            values = value if isinstance(value, tuple) else (value,)
            if len(values) == 1:
                out[i] = values[0]
            elif len(values) == n_layers:
                out[i] = values
            else:
                raise ValidationError(f"profile {self.name!r}: {name} has {len(values)} values; the stream has "
                                      f"{n_layers} MoE layers (give one value, or one per layer)", field=name)
        return out

    def transfer_s(self, nbytes: int) -> float:
        """Seconds one transfer of ``nbytes`` occupies its channel."""
        return self.latency_s + nbytes * self.copy_streams / self.bandwidth

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in _PER_LAYER:
            if isinstance(d[name], tuple):
                d[name] = list(d[name])
        return d


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _from_dict(d: Any, source: str) -> HardwareProfile:
    if not isinstance(d, dict):
        raise ValidationError(f"expected a JSON object; got {type(d).__name__}", source=source)
    known = set(HardwareProfile.__dataclass_fields__)
    d = {k: v for k, v in d.items() if k not in ("schema_version", "tool_version")}   # what save_profile adds
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValidationError(f"unknown field(s) {', '.join(unknown)}; expected some of {', '.join(sorted(known))}",
                              source=source, field=unknown[0])
    for req in ("name", "source", "bandwidth"):
        if req not in d:
            raise ValidationError(f"missing field {req!r}", source=source, field=req)
    kwargs = dict(d)
    for name in _PER_LAYER:
        if isinstance(kwargs.get(name), list):
            kwargs[name] = tuple(kwargs[name])
    try:
        return HardwareProfile(**kwargs)
    except ValidationError as exc:
        raise ValidationError(exc.detail, source=source, field=exc.field) from None
    except TypeError as exc:
        raise ValidationError(f"malformed profile: {exc}", source=source) from None


def load_profile(name_or_path: str | os.PathLike[str]) -> HardwareProfile:
    """A built-in profile by name (:data:`PROFILES`) or a profile JSON file."""
    if isinstance(name_or_path, str) and name_or_path in PROFILES:
        return PROFILES[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise ValidationError(f"no such profile: expected one of {', '.join(PROFILES)} or a JSON file",
                              source=str(name_or_path))
    if path.stat().st_size > _MAX_PROFILE_BYTES:
        raise ValidationError(f"a profile is a small JSON object; this file has {path.stat().st_size} bytes",
                              source=str(path))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValidationError(f"not valid JSON: {str(exc)[:120]}", source=str(path)) from None
    return _from_dict(data, str(path))


def save_profile(profile: HardwareProfile, path: str | os.PathLike[str]) -> Path:
    """Write ``profile`` as JSON (atomically)."""
    atomic_write_bytes(Path(path), (json_text(profile.to_dict(), indent=2) + "\n").encode())
    return Path(path)


def profile_names() -> tuple[str, ...]:
    """Names of the built-in profiles."""
    return tuple(PROFILES)


# Built-in link profiles. The link figures are effective host-to-device rates commonly measured for pinned-memory
# copies of large buffers (nominal: PCIe Gen4 x16 31.5 GB/s, Gen5 x16 63 GB/s per direction; NVLink-C2C 450 GB/s
# per direction); the compute figures are ASSUMPTIONS, not measurements: zero dense cost and a small per-token
# expert cost, so that the link dominates. Measure your own with `expertcache timing calibrate`.
_ASSUMED_COMPUTE = "compute costs are assumptions (not measured): dense 0, expert 20 us + 1 us per routed token"
PROFILES: dict[str, HardwareProfile] = {
    "pcie-gen4-x16": HardwareProfile(
        "pcie-gen4-x16", "link: PCIe Gen4 x16, 25 GB/s effective of 31.5 GB/s nominal, 10 us per transfer; "
        + _ASSUMED_COMPUTE, 25e9, 10e-6, 1, True, None, 0.0, 0.0, 20e-6, 1e-6),
    "pcie-gen5-x16": HardwareProfile(
        "pcie-gen5-x16", "link: PCIe Gen5 x16, 50 GB/s effective of 63 GB/s nominal, 10 us per transfer; "
        + _ASSUMED_COMPUTE, 50e9, 10e-6, 1, True, None, 0.0, 0.0, 20e-6, 1e-6),
    "nvlink-c2c": HardwareProfile(
        "nvlink-c2c", "link: NVLink-C2C (Grace Hopper), 400 GB/s effective of 450 GB/s per direction, 5 us per "
        "transfer; " + _ASSUMED_COMPUTE, 400e9, 5e-6, 1, True, None, 0.0, 0.0, 20e-6, 1e-6),
}
