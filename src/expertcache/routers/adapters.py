"""Where the native router lives in a Hugging Face MoE model, and how it turns logits into a distribution.

This reuses the collector's adapter registry
(:mod:`expertcache.collect.adapters`, keyed by ``config.model_type``: Qwen3-MoE,
Qwen2-MoE, OLMoE, Mixtral, GraniteMoE, GPT-OSS, DeepSeek-V3), so a model the
collector can trace is a model the routers can attach to, and ``l`` counts MoE
layers only (dense layers skipped) exactly as in the trace. The router's
parent module is the MoE block whose input the routers read.

The native distribution ``p^R`` is the adapter's ``score``: the softmax of the
logits, or for DeepSeek-V3 the sigmoid scores normalised to sum to one, so all
router outputs are distributions over the same expert set (CLR §3.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["NativeRouter", "find_native_routers", "native_kind"]


@dataclass(frozen=True)
class NativeRouter:
    """One MoE layer's native router inside a model.

    Attributes
    ----------
    layer
        MoE layer index ``l`` (dense layers are not counted).
    name
        Dotted module name of the router (e.g. ``model.layers.0.mlp.gate``).
    block_name
        Dotted module name of the MoE block that owns it (its parent).
    router, block
        The modules themselves (``torch.nn.Module``).
    """

    layer: int
    name: str
    block_name: str
    router: Any
    block: Any


def native_kind(model: Any) -> str:
    """``"softmax"`` or ``"sigmoid"``: how the model's router logits become ``p^R``.

    Raises ValidationError for an architecture the collector does not support.
    """
    from ..collect.adapters import adapter_for

    return adapter_for(model.config).score


def find_native_routers(model: Any) -> list[NativeRouter]:
    """The native routers of ``model`` in MoE-layer order, with their MoE blocks."""
    from ..collect.adapters import adapter_for, find_moe_layers

    modules = dict(model.named_modules())
    out = []
    for layer in find_moe_layers(model, adapter_for(model.config)):
        block_name = layer.name.rpartition(".")[0]
        out.append(NativeRouter(layer.index, layer.name, block_name, layer.router, modules[block_name]))
    return out
