"""The two memory tiers of the executor (needs torch).

* :class:`HostTier` — every routed expert's weights, per MoE layer: a CPU copy (pinned when the
  device is CUDA, so copies can be asynchronous) or, with ``mmap``, views straight into the
  checkpoint's ``.safetensors`` file(s), memory-mapped, never read into RAM as a whole.
* :class:`DeviceTier` — per partition (a layer under per-layer scope, one pool under global scope)
  ``S`` slots of expert weights on the compute device: ``c`` cache slots plus a workspace for the
  misses of the current unit beyond capacity. Each copy host -> slot is one counted transfer.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path
from typing import Any

import torch

from ..errors import ValidationError

__all__ = ["HostTier", "DeviceTier", "safetensors_views"]

_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def safetensors_views(model_dir: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Zero-copy tensors over every ``*.safetensors`` file of ``model_dir`` (memory-mapped, read-only).

    Raises
    ------
    ValidationError
        No safetensors file, or a tensor dtype this reader does not map.
    """
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValidationError("--host-tier mmap needs the model's .safetensors files in a local directory",
                              source=str(model_dir))
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with open(f, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        (n,) = struct.unpack("<Q", mm[:8])
        header = json.loads(mm[8:8 + n])
        base = 8 + n
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            dtype = _ST_DTYPES.get(meta["dtype"])
            if dtype is None:
                raise ValidationError(f"tensor {name} has dtype {meta['dtype']}; --host-tier mmap reads "
                                      f"{', '.join(_ST_DTYPES)}", source=str(f))
            lo, hi = meta["data_offsets"]
            numel = 1
            for d in meta["shape"]:
                numel *= d
            import warnings

            with warnings.catch_warnings():   # the buffer is read-only; the tier never writes to it
                warnings.simplefilter("ignore", UserWarning)
                t = torch.frombuffer(mm, dtype=dtype, count=numel, offset=base + lo) if numel else torch.empty(0, dtype=dtype)
            assert hi - lo == numel * t.element_size()
            out[name] = t.view(meta["shape"])
    return out


class HostTier:
    """Expert weights of every MoE layer off the device.

    ``tensors[l][name]`` is ``[N, ...]`` for each expert parameter ``name`` of layer ``l``;
    expert ``e``'s block is ``tensors[l][name][e]`` for every ``name``.
    """

    def __init__(self, tensors: list[dict[str, torch.Tensor]], kind: str) -> None:
        self.tensors = tensors
        self.kind = kind
        first = tensors[0]
        self.block_bytes = int(sum(t[0].numel() * t.element_size() for t in first.values()))

    def block(self, layer: int, expert: int) -> dict[str, torch.Tensor]:
        """The tensors of expert ``expert`` of MoE layer ``layer``."""
        return {name: t[expert] for name, t in self.tensors[layer].items()}

    @property
    def nbytes(self) -> int:
        """Bytes held by this tier (mapped bytes for ``mmap``)."""
        return int(sum(t.numel() * t.element_size() for d in self.tensors for t in d.values()))


class DeviceTier:
    """Slots on the compute device, per partition.

    Parameters
    ----------
    like
        One layer's ``{name: [N, ...]}`` host tensors (shapes and dtypes of a block).
    slots
        Slots per partition (cache capacity + workspace).
    device
        Compute device.
    dtype
        Dtype of the slots (the model's).
    """

    def __init__(self, like: dict[str, torch.Tensor], slots: list[int], device: torch.device,
                 dtype: torch.dtype) -> None:
        self.device = device
        self.slots = [int(s) for s in slots]
        self.tensors: list[dict[str, torch.Tensor]] = [
            {name: torch.zeros((max(s, 1), *t.shape[1:]), dtype=dtype, device=device) for name, t in like.items()}
            for s in self.slots]
        self.free: list[list[int]] = [list(range(s)) for s in self.slots]
        self.slot_of: list[dict[int, int]] = [{} for _ in self.slots]
        self.high_water = [0] * len(self.slots)

    @property
    def nbytes(self) -> int:
        """Bytes of device memory the slots occupy (allocated, not merely used)."""
        return int(sum(t.numel() * t.element_size() for d in self.tensors for t in d.values()))

    def load(self, part: int, block: int, src: dict[str, torch.Tensor], non_blocking: bool) -> int:
        """Copy ``src`` into the lowest free slot of partition ``part``; returns the slot."""
        if not self.free[part]:
            raise RuntimeError(f"partition {part} has no free slot (all {self.slots[part]} in use)")
        slot = self.free[part].pop(0)
        for name, t in src.items():
            self.tensors[part][name][slot].copy_(t, non_blocking=non_blocking)
        self.slot_of[part][block] = slot
        used = self.slots[part] - len(self.free[part])
        self.high_water[part] = max(self.high_water[part], used)
        return slot

    def release(self, part: int, block: int) -> None:
        """Free the slot of ``block``."""
        slot = self.slot_of[part].pop(block)
        self.free[part].append(slot)
        self.free[part].sort()

    def place(self, part: int, block: int, slot: int) -> None:
        """Record that ``block`` already sits in ``slot`` (static pin list loaded up front)."""
        self.slot_of[part][block] = slot

    def expert_tensors(self, part: int) -> dict[str, Any]:
        """The slot tensors of partition ``part``, by parameter name."""
        return self.tensors[part]
