"""Loading a MoE model without its routed experts (needs torch and transformers).

``--host-tier mmap`` never materialises the expert weights: the model is built as a skeleton on the
``meta`` device (as ``from_pretrained`` builds it; no weight is allocated), the
non-expert weights are read from the checkpoint through transformers' own renaming and conversion
(``convert_and_load_state_dict_in_model``, the routine ``from_pretrained`` uses), and the host tier is
a set of views into the memory-mapped ``.safetensors`` files — one expert's tensors are copied into a
device slot on a miss, nothing else is read. The expert layout of the file is taken from transformers'
checkpoint conversion mapping: either the stacked parameter itself (``gate_up_proj [N, 2I, H]``:
GraniteMoE, GPT-OSS) or one tensor per expert merged by ``MergeModulelist(dim=0)`` and, for fused
parameters, ``Concatenate(dim=1)`` (``experts.{e}.gate_proj`` + ``up_proj`` -> ``gate_up_proj``:
Qwen-MoE, OLMoE, DeepSeek-V3, Mixtral's ``w1``/``w3``/``w2``). Any other conversion (a transpose,
quantised tensors, a layout this module does not know) raises :class:`UnmappableCheckpoint`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ..collect.adapters import adapter_for, find_moe_layers
from ..errors import ValidationError
from .moe import expert_parameters
from .tiers import HostTier, safetensors_views

__all__ = ["load_offloaded", "UnmappableCheckpoint"]


class UnmappableCheckpoint(ValidationError):
    """The checkpoint cannot serve as a memory-mapped host tier (``--host-tier auto`` then loads it in RAM)."""


def _materialise_buffers(model: Any) -> None:
    """Give every buffer still on ``meta`` (RoPE ``inv_freq``: not in the checkpoint) its value.

    As ``from_pretrained`` does after loading: an empty CPU tensor, then the model's own
    ``_init_weights`` on the module that owns it, which recomputes such buffers from the config.
    """
    owners = []
    for module in model.modules():
        hit = False
        for name, buf in module._buffers.items():
            if buf is not None and buf.is_meta:
                module._buffers[name] = torch.empty_like(buf, device="cpu")
                hit = True
        if hit:
            owners.append(module)
    with torch.no_grad():
        for module in owners:
            model._init_weights(module)


def _dtype(config: Any, views: dict[str, torch.Tensor], dtype: str) -> torch.dtype:
    """``dtype`` resolved as ``from_pretrained(dtype="auto")`` does: the config's, else the file's."""
    if dtype != "auto":
        return getattr(torch, dtype)
    d = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(d, str):
        d = getattr(torch, d, None)
    if isinstance(d, torch.dtype):
        return d
    return next((v.dtype for v in views.values() if v.is_floating_point()), torch.float32)


def _ram_copy(view: torch.Tensor) -> torch.Tensor:
    """``view`` copied into RAM at the same address modulo 64 as in the mapped file.

    ``from_pretrained`` leaves CPU weights on its own file mapping, so their addresses sit at the
    file's data offsets; CPU matmul kernels choose their vector paths (and so the order of float
    sums) by alignment, so a copy aligned differently gives logits that differ in the last bits.
    The mapping here is read-only (a write would fault), hence a writable copy, placed alike.
    """
    n = view.numel() * view.element_size()
    if n == 0:
        return view.clone()
    buf = torch.empty(n + 64, dtype=torch.uint8)
    shift = (view.data_ptr() - buf.data_ptr()) % 64
    if shift % view.element_size():
        return view.clone()
    out = buf[shift:shift + n].view(view.dtype).view(view.shape)
    out.copy_(view)
    return out


def _expert_layout(mod: str, name: str, shape: torch.Size, views: dict[str, torch.Tensor],
                   converters: list[Any], n_experts: int, source: str) -> list[list[torch.Tensor]]:
    """Per expert, the views whose concatenation along dim 0 is ``mod.name[e]`` (``shape = [N, ...]``)."""
    stacked = views.get(f"{mod}.{name}")
    if stacked is not None:
        if tuple(stacked.shape) != tuple(shape):
            raise UnmappableCheckpoint(f"{mod}.{name} is {tuple(stacked.shape)} in the checkpoint but "
                                       f"{tuple(shape)} in the model", source=source, field="host_tier")
        return [[stacked[e]] for e in range(n_experts)]
    conv = next((c for c in converters if any(str(t).endswith(f"experts.{name}") for t in c.target_patterns)), None)
    if conv is None:
        raise UnmappableCheckpoint(f"the checkpoint has neither {mod}.{name} nor a per-expert conversion into it",
                                   source=source, field="host_tier")
    ops = [(type(op).__name__, getattr(op, "dim", None)) for op in conv.operations]
    if ops not in ([("MergeModulelist", 0)], [("MergeModulelist", 0), ("Concatenate", 1)]):
        raise UnmappableCheckpoint(f"{mod}.{name} is converted by {', '.join(n for n, _ in ops)} on load; the "
                                   "mapped host tier reads only stacked or merged per-expert tensors",
                                   source=source, field="host_tier")
    leaves = [str(p).split("*.", 1)[-1] for p in conv.source_patterns]
    out = []
    for e in range(n_experts):
        keys = [f"{mod}.{e}.{leaf}" for leaf in leaves]
        missing = [k for k in keys if k not in views]
        if missing:
            raise UnmappableCheckpoint(f"expert tensor {missing[0]} is not in the checkpoint", source=source,
                                       field="host_tier")
        pieces = [views[k] for k in keys]
        rows = sum(p.shape[0] for p in pieces)
        if any(tuple(p.shape[1:]) != tuple(shape[2:]) for p in pieces) or rows != shape[1]:
            raise UnmappableCheckpoint(f"expert {e} of {mod}.{name}: pieces {[tuple(p.shape) for p in pieces]} do "
                                       f"not stack to {tuple(shape[1:])}", source=source, field="host_tier")
        out.append(pieces)
    return out


def load_offloaded(model_dir: str | os.PathLike[str], dtype: str = "auto") -> tuple[Any, HostTier]:
    """The model with every routed expert left on ``meta``, and a host tier mapped from its checkpoint.

    Parameters
    ----------
    model_dir
        A local model directory with ``config.json`` and ``*.safetensors``.
    dtype
        ``auto`` (the config's dtype, as ``from_pretrained``) or a torch dtype name; the device slots
        use it, and each copy from the file casts as ``from_pretrained`` would.

    Returns
    -------
    (model, host)
        ``model``: eval mode, non-expert weights loaded (copied into RAM), expert parameters on
        ``meta`` (the executor replaces them by slot tensors). ``host``: :class:`HostTier` ``mmap``.

    Raises
    ------
    UnmappableCheckpoint
        Not a local directory of safetensors files, a dtype the reader does not map, or an expert
        layout other than stacked / merged per-expert tensors.
    ValidationError
        The architecture has no stacked experts module (as for ``--host-tier ram``), or a non-expert
        weight the checkpoint lacks.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers import initialization as hf_init
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (
        WeightConverter,
        WeightRenaming,
        convert_and_load_state_dict_in_model,
        rename_source_key,
    )
    from transformers.modeling_utils import LoadStateDictConfig

    d = Path(model_dir)
    source = str(d)
    if not d.is_dir() or not any(d.glob("*.safetensors")):
        raise UnmappableCheckpoint("the mapped host tier needs a local model directory with .safetensors files",
                                   source=source, field="host_tier")
    try:
        views = safetensors_views(d)
    except ValidationError as e:
        raise UnmappableCheckpoint(str(e).split(": ", 1)[-1], source=source, field="host_tier") from None
    config = AutoConfig.from_pretrained(d)
    dt = _dtype(config, views, dtype)
    with torch.device("meta"), hf_init.meta_device_safe_creation_ops():   # as from_pretrained builds it
        model = AutoModelForCausalLM.from_config(config, dtype=dt)
    adapter = adapter_for(model.config)
    layers = find_moe_layers(model, adapter)
    n_experts = adapter.n_experts(model.config)
    names = [expert_parameters(layer.experts, n_experts) for layer in layers]
    qualified = {id(m): n for n, m in model.named_modules()}
    mods = [qualified[id(layer.experts)] for layer in layers]
    expert_params = {f"{m}.{n}" for m, ns in zip(mods, names, strict=True) for n in ns}

    mapping = get_model_conversion_mapping(model)
    renamings = [w for w in mapping if isinstance(w, WeightRenaming)]
    converters = [w for w in mapping if isinstance(w, WeightConverter)]
    meta_state = model.state_dict()
    expert_views: dict[str, torch.Tensor] = {}
    rest: dict[str, torch.Tensor] = {}
    prefixes = tuple(f"{m}." for m in mods)
    for key, view in views.items():
        renamed, _ = rename_source_key(key, renamings, [], model.base_model_prefix, meta_state)
        if renamed.startswith(prefixes):
            expert_views[renamed] = view
        else:
            rest[key] = _ram_copy(view)

    pieces = []
    for m, ns in zip(mods, names, strict=True):
        per_name = {n: _expert_layout(m, n, meta_state[f"{m}.{n}"].shape, expert_views, converters, n_experts,
                                      source) for n in ns}
        pieces.append([{n: per_name[n][e] for n in ns} for e in range(n_experts)])
    used = {id(t) for layer in pieces for block in layer for ps in block.values() for t in ps}
    stacked_used = {k for k in expert_views if any(k == f"{m}.{n}" for m, ns in zip(mods, names, strict=True)
                                                   for n in ns)}
    unused = [k for k, v in expert_views.items() if k not in stacked_used and id(v) not in used]
    if unused:
        raise UnmappableCheckpoint(f"checkpoint tensor {unused[0]} belongs to an experts module but no expert "
                                   "parameter reads it", source=source, field="host_tier")

    info, _ = convert_and_load_state_dict_in_model(
        model, rest, LoadStateDictConfig(pretrained_model_name_or_path=source, dtype=dt, weight_mapping=mapping))
    problems = sorted(info.unexpected_keys) + sorted(info.mismatched_keys) + sorted(info.conversion_errors)
    if problems:
        raise UnmappableCheckpoint(f"loading the non-expert weights failed at {problems[0]}", source=source,
                                   field="host_tier")
    model.tie_weights()
    _materialise_buffers(model)
    still = [n for n, p in model.named_parameters() if p.is_meta and n not in expert_params]
    still += [n for n, b in model.named_buffers() if b.is_meta]
    if still:
        raise ValidationError(f"the checkpoint lacks the weight {still[0]}", source=source, field="model")
    if (d / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(d)
    return model.eval(), HostTier(pieces, "mmap")
