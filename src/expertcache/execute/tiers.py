"""The two memory tiers of the executor (needs torch).

* :class:`HostTier` — every routed expert's weights, per MoE layer: a CPU copy (pinned when the
  device is CUDA, so copies can be asynchronous) or, with ``mmap``, views straight into the
  checkpoint's ``.safetensors`` file(s), memory-mapped, never read into RAM as a whole
  (:func:`expertcache.execute.checkpoint.load_offloaded` builds it without loading the experts).
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

    ``pieces[l][e][name]`` lists the host tensors whose concatenation along dim 0 is expert ``e``'s
    slice of parameter ``name`` in MoE layer ``l`` (one piece for a RAM copy or a stacked checkpoint
    tensor; gate and up separately when the checkpoint stores experts one by one).
    """

    def __init__(self, pieces: list[list[dict[str, list[torch.Tensor]]]], kind: str) -> None:
        self.pieces = pieces
        self.kind = kind
        self.block_bytes = int(sum(t.numel() * t.element_size() for ps in pieces[0][0].values() for t in ps))

    @classmethod
    def from_stacked(cls, tensors: list[dict[str, torch.Tensor]], kind: str) -> HostTier:
        """From per-layer ``{name: [N, ...]}`` tensors (views, no copy)."""
        return cls([[{n: [t[e]] for n, t in d.items()} for e in range(next(iter(d.values())).shape[0])]
                    for d in tensors], kind)

    def block(self, layer: int, expert: int) -> dict[str, list[torch.Tensor]]:
        """The pieces of expert ``expert`` of MoE layer ``layer``."""
        return self.pieces[layer][expert]

    def like(self) -> dict[str, torch.Tensor]:
        """``{name: meta tensor}`` shaped like one expert block (the shape of a device slot)."""
        out = {}
        for name, parts in self.pieces[0][0].items():
            shape = parts[0].shape if len(parts) == 1 else (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
            out[name] = torch.empty(shape, dtype=parts[0].dtype, device="meta")
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of expert weights this tier holds (mapped bytes for ``mmap``)."""
        return self.block_bytes * sum(len(layer) for layer in self.pieces)


class DeviceTier:
    """Slots on the compute device, per partition.

    Parameters
    ----------
    like
        ``{name: tensor}`` of one expert block (shapes of a slot).
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
            {name: torch.zeros((max(s, 1), *t.shape), dtype=dtype, device=device) for name, t in like.items()}
            for s in self.slots]
        self.free: list[list[int]] = [list(range(s)) for s in self.slots]
        self.slot_of: list[dict[int, int]] = [{} for _ in self.slots]
        self.high_water = [0] * len(self.slots)

    @property
    def nbytes(self) -> int:
        """Bytes of device memory the slots occupy (allocated, not merely used)."""
        return int(sum(t.numel() * t.element_size() for d in self.tensors for t in d.values()))

    def reserve(self, part: int, needed: int) -> None:
        """Make sure partition ``part`` has at least ``needed`` slots: the workspace grows (never shrinks)
        when one unit needs more blocks resident at once than any before (a long prompt's prefill)."""
        have = self.slots[part]
        if needed <= have:
            return
        for name, t in self.tensors[part].items():
            grown = torch.zeros((needed, *t.shape[1:]), dtype=t.dtype, device=t.device)
            grown[:have] = t[:have]          # residents keep their slots (a device-side copy, not a transfer)
            self.tensors[part][name] = grown
        self.free[part].extend(range(have, needed))
        self.slots[part] = needed

    def load(self, part: int, block: int, src: dict[str, list[torch.Tensor]], non_blocking: bool) -> int:
        """Copy the pieces ``src`` into the lowest free slot of partition ``part``; returns the slot."""
        if not self.free[part]:
            raise RuntimeError(f"partition {part} has no free slot (all {self.slots[part]} in use)")
        slot = self.free[part].pop(0)
        for name, parts in src.items():
            dst = self.tensors[part][name][slot]
            if len(parts) == 1:
                dst.copy_(parts[0], non_blocking=non_blocking)
            else:
                row = 0
                for t in parts:
                    dst[row:row + t.shape[0]].copy_(t, non_blocking=non_blocking)
                    row += t.shape[0]
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
