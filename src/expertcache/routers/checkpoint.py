"""Checkpoints of router training, in safetensors (no pickle anywhere).

A checkpoint is a directory, written atomically:

- ``routers.safetensors`` — the Temporal/Spatio Router weights (``temporal.{l}.weight``,
  ``spatio.{l}.weight``, optional ``.bias``), float32, with the shape and the
  native distribution kind in the file's metadata; readable with
  ``safetensors.numpy`` alone (what :mod:`expertcache.routers.advice` does).
- ``backbone.safetensors`` — the backbone weights, only when the mode trains them.
- ``optimizer.safetensors`` — AdamW state tensors (``state.{i}.{name}``) and the torch RNG state.
- ``trainer.json`` — optimizer step, micro-batch counter, the training config, the loss history.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ValidationError

__all__ = ["RouterWeights", "load_router_weights", "weights_of", "ROUTERS_FILE", "BACKBONE_FILE", "OPTIMIZER_FILE",
           "TRAINER_FILE", "save_checkpoint", "load_checkpoint_into", "read_trainer_state"]

ROUTERS_FILE = "routers.safetensors"
BACKBONE_FILE = "backbone.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
TRAINER_FILE = "trainer.json"


@dataclass(frozen=True)
class RouterWeights:
    """Router weights as numpy arrays (no torch needed).

    Attributes
    ----------
    temporal_w, spatio_w
        ``float32[L, N, d]``.
    temporal_b, spatio_b
        ``float32[L, N]`` or ``None``.
    kind
        ``"softmax"`` or ``"sigmoid"``: how native logits become ``p^R``.
    meta
        The file's metadata (mode, capacity, tau, ...).
    """

    temporal_w: np.ndarray
    spatio_w: np.ndarray
    temporal_b: np.ndarray | None
    spatio_b: np.ndarray | None
    kind: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        """``L``."""
        return int(self.temporal_w.shape[0])

    @property
    def n_experts(self) -> int:
        """``N``."""
        return int(self.temporal_w.shape[1])


def weights_of(routers: Any) -> RouterWeights:
    """The live routers' current weights as a :class:`RouterWeights` (what a checkpoint of them would load as)."""
    sd = {k: v.detach().float().cpu().numpy() for k, v in routers.state_dict().items()}
    L = int(routers.n_layers)

    def stack(prefix: str, what: str) -> np.ndarray | None:
        keys = [f"{prefix}.{l}.{what}" for l in range(L)]
        return np.stack([sd[k] for k in keys]) if all(k in sd for k in keys) else None

    tw, sw = stack("temporal", "weight"), stack("spatio", "weight")
    assert tw is not None and sw is not None
    return RouterWeights(tw, sw, stack("temporal", "bias"), stack("spatio", "bias"), str(routers.kind),
                         {"n_layers": L})


def load_router_weights(path: str | os.PathLike[str]) -> RouterWeights:
    """Read ``routers.safetensors`` (a file, or a checkpoint directory holding one) with numpy.

    Validated before anything is stacked: the file opens as safetensors, its ``expertcache`` metadata
    is a JSON object whose ``n_layers`` is a bounded positive integer equal to the number of layers
    the file holds, and every layer's weight (``[N, d]``, floats) and bias (``[N]``) has the same shape.
    """
    from safetensors import safe_open

    from ..jsonl import json_object
    from ..storage import MAX_LAYERS

    p = Path(path)
    if p.is_dir():
        p = p / ROUTERS_FILE
    if not p.is_file():
        raise ValidationError(f"{p}: no router checkpoint here; expected the output directory of "
                              "`expertcache routers train`")
    src = str(p)
    try:
        with safe_open(src, framework="numpy") as f:
            meta = f.metadata() or {}
            keys = list(f.keys())
            if len(keys) > 4 * MAX_LAYERS:
                raise ValidationError(f"holds {len(keys)} tensors; a router file holds at most 4 per layer",
                                      source=src)
            t = {k: f.get_tensor(k) for k in keys}
    except ValidationError:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own SafetensorError for a malformed file
        raise ValidationError(f"cannot read router weights ({type(exc).__name__}: {str(exc)[:120]}); expected "
                              "the routers.safetensors of `expertcache routers train`", source=src) from None
    raw = meta.get("expertcache", "{}")
    info = json_object(raw if isinstance(raw, str) else "null", src, 1)
    L = info.get("n_layers")
    if isinstance(L, bool) or not isinstance(L, int) or not 1 <= L <= MAX_LAYERS:
        raise ValidationError(f"metadata n_layers must be an integer in [1, {MAX_LAYERS}]; got {str(L)[:40]}",
                              source=src, field="n_layers")
    present = sum(1 for k in t if k.startswith("temporal.") and k.endswith(".weight"))
    if present != L:
        raise ValidationError(f"metadata declares {L} layers; the file holds temporal weights for {present}",
                              source=src, field="n_layers")

    def stack(prefix: str, what: str) -> np.ndarray | None:
        keys = [f"{prefix}.{l}.{what}" for l in range(L)]
        if not all(k in t for k in keys):
            if what == "bias":
                return None
            raise ValidationError(f"router file lacks {prefix}.*.{what}", source=src)
        first = t[keys[0]]
        ndim = 2 if what == "weight" else 1
        for k in keys:
            a = t[k]
            if a.ndim != ndim or a.shape != first.shape or a.dtype.kind != "f" or 0 in a.shape:
                raise ValidationError(f"expected {'[N, d]' if ndim == 2 else '[N]'} floats of one shape on every "
                                      f"layer; got {a.dtype} {list(a.shape)}", source=src, field=k)
        return np.stack([t[k].astype(np.float32) for k in keys])

    tw, sw = stack("temporal", "weight"), stack("spatio", "weight")
    tb, sb = stack("temporal", "bias"), stack("spatio", "bias")
    if sw.shape != tw.shape or any(b is not None and b.shape != tw.shape[:2] for b in (tb, sb)):
        raise ValidationError(f"temporal and spatio weights (and biases) must agree on [L, N, d] = {list(tw.shape)}",
                              source=src, field="spatio")
    kind = info.get("kind", "softmax")
    if kind not in ("softmax", "sigmoid"):
        raise ValidationError(f"metadata kind must be 'softmax' or 'sigmoid'; got {str(kind)[:40]!r}", source=src,
                              field="kind")
    return RouterWeights(tw, sw, tb, sb, kind, info)


def save_checkpoint(out: str | os.PathLike[str], *, routers: Any, optimizer: Any, trainer: dict[str, Any],
                    backbone: Any | None = None, meta: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint directory atomically (replacing an older one at ``out``)."""
    import torch
    from safetensors.torch import save_file, save_model

    from ..storage import atomic_directory, json_text

    info = {"n_layers": routers.n_layers, "n_experts": routers.n_experts, "d_model": routers.d_model,
            "kind": routers.kind, **(meta or {})}
    with atomic_directory(out, overwrite=True) as tmp:
        sd = {k: v.detach().float().contiguous().cpu() for k, v in routers.state_dict().items()}
        save_file(sd, str(tmp / ROUTERS_FILE), metadata={"expertcache": json.dumps(info)})
        if backbone is not None:
            save_model(backbone, str(tmp / BACKBONE_FILE))
        if optimizer is not None:
            osd = optimizer.state_dict()
            tensors = {f"state.{i}.{name}": v.detach().contiguous().cpu()
                       for i, st in osd["state"].items() for name, v in st.items() if isinstance(v, torch.Tensor)}
            tensors["rng.torch"] = torch.get_rng_state()
            groups = [{k: v for k, v in g.items()} for g in osd["param_groups"]]
            save_file(tensors, str(tmp / OPTIMIZER_FILE), metadata={"param_groups": json.dumps(groups)})
        (tmp / TRAINER_FILE).write_text(json_text(trainer, indent=1))
    return Path(out)


def read_trainer_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``trainer.json`` of a checkpoint directory."""
    p = Path(path) / TRAINER_FILE
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ValidationError(f"cannot read the trainer state ({exc}); expected a checkpoint directory "
                              "written by `expertcache routers train`", source=str(p)) from None


def load_checkpoint_into(path: str | os.PathLike[str], *, routers: Any, optimizer: Any | None = None,
                         backbone: Any | None = None) -> dict[str, Any]:
    """Load a checkpoint's tensors into live objects; returns its trainer state.

    Restores router weights, the backbone (when the checkpoint has one and
    ``backbone`` is given), the optimizer state and the torch RNG state, so a
    resumed run continues exactly where the saved one stopped.
    """
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, load_model

    d = Path(path)
    state = read_trainer_state(d)
    routers.load_state_dict(load_file(str(d / ROUTERS_FILE)))
    if backbone is not None and (d / BACKBONE_FILE).is_file():
        load_model(backbone, str(d / BACKBONE_FILE))
    if optimizer is not None and (d / OPTIMIZER_FILE).is_file():
        with safe_open(str(d / OPTIMIZER_FILE), framework="pt") as f:
            groups = json.loads((f.metadata() or {})["param_groups"])
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        st: dict[int, dict[str, Any]] = {}
        for k, v in tensors.items():
            if k.startswith("state."):
                _, i, name = k.split(".", 2)
                st.setdefault(int(i), {})[name] = v
        optimizer.load_state_dict({"state": st, "param_groups": groups})
        torch.set_rng_state(tensors["rng.torch"])
    return state
