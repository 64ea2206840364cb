"""Per-architecture router adapters, keyed by ``config.model_type`` (issue 4, item 1).

An adapter says where an architecture's routed-expert router lives and how to
read its output; it holds names only, so this module imports no torch. Every
supported router in transformers 5.x is a module whose forward returns
``(router_logits, topk_weights, topk_indices)`` flattened over batch x time
(checked against the installed ``modeling_*.py`` files):

=============  ==========================  =========================================================
model_type     router class                selection (what the model itself does)
=============  ==========================  =========================================================
qwen3_moe      ``Qwen3MoeTopKRouter``      top-k of softmax(logits); weights renormalised if norm_topk_prob
qwen2_moe      ``Qwen2MoeTopKRouter``      same; the shared expert (``shared_expert``) is not routed
olmoe          ``OlmoeTopKRouter``         same as Qwen3-MoE
mixtral        ``MixtralTopKRouter``       top-k of softmax(logits), weights renormalised
granitemoe     ``GraniteMoeTopKRouter``    top-k of logits, weights = softmax over the k chosen logits
gpt_oss        ``GptOssTopKRouter``        top-k of logits (+ bias), weights = softmax over the k
deepseek_v3    ``DeepseekV3TopkRouter``    sigmoid scores + ``e_score_correction_bias``, group-limited
                                           (n_group / topk_group) top-k; weights are the unbiased
                                           scores of the chosen, normalised, x routed_scaling_factor
=============  ==========================  =========================================================

The collector hooks the router module and records the third output, the
indices the model routes its tokens with, so bias and group selection are
captured as the model applies them instead of being re-derived from logits.
Dense layers (DeepSeek-V3's ``first_k_dense_replace``, Qwen's ``mlp_only_layers``)
simply have no router and are not MoE layers of the trace; shared experts are
not routed and never appear.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import ValidationError

__all__ = ["RouterAdapter", "ADAPTERS", "register_adapter", "adapter_for", "MoELayer"]


@dataclass(frozen=True)
class RouterAdapter:
    """How to find and read the routed-expert router of one architecture.

    Attributes
    ----------
    model_type
        ``config.model_type`` this adapter serves.
    router_class
        Class name of the router module in transformers' modeling file.
    n_experts_attr
        Config attribute holding the number of routed experts ``N``.
    top_k_attr
        Config attribute holding the experts per token ``k``.
    score
        How router probabilities are derived from the logits for the recorded
        ``probs``/``entropy``/``margin``: ``"softmax"`` (p = softmax(logits)) or
        ``"sigmoid"`` (p = sigmoid(logits) / sum(sigmoid(logits)), DeepSeek-V3).
    experts_attr
        Attribute of the router's parent module holding the routed experts
        (used to measure the bytes of one expert block).
    """

    model_type: str
    router_class: str
    n_experts_attr: str
    top_k_attr: str = "num_experts_per_tok"
    score: str = "softmax"
    experts_attr: str = "experts"

    def __post_init__(self) -> None:
        if self.score not in ("softmax", "sigmoid"):
            raise ValueError(f"score must be 'softmax' or 'sigmoid'; got {self.score!r}")

    def n_experts(self, config: Any) -> int:
        """Routed experts ``N`` per MoE layer, from the config."""
        return int(getattr(config, self.n_experts_attr))

    def top_k(self, config: Any) -> int:
        """Experts per token ``k``, from the config."""
        return int(getattr(config, self.top_k_attr))


#: Registered adapters by ``config.model_type``.
ADAPTERS: dict[str, RouterAdapter] = {}


def register_adapter(adapter: RouterAdapter) -> RouterAdapter:
    """Add ``adapter`` to :data:`ADAPTERS`; a duplicate model_type raises."""
    if adapter.model_type in ADAPTERS:
        raise ValueError(f"an adapter for {adapter.model_type!r} is already registered")
    ADAPTERS[adapter.model_type] = adapter
    return adapter


for _a in (
    RouterAdapter("qwen3_moe", "Qwen3MoeTopKRouter", "num_experts"),
    RouterAdapter("qwen2_moe", "Qwen2MoeTopKRouter", "num_experts"),
    RouterAdapter("olmoe", "OlmoeTopKRouter", "num_experts"),
    RouterAdapter("mixtral", "MixtralTopKRouter", "num_local_experts"),
    RouterAdapter("granitemoe", "GraniteMoeTopKRouter", "num_local_experts"),
    RouterAdapter("gpt_oss", "GptOssTopKRouter", "num_local_experts"),
    RouterAdapter("deepseek_v3", "DeepseekV3TopkRouter", "n_routed_experts", score="sigmoid"),
):
    register_adapter(_a)


def adapter_for(config: Any) -> RouterAdapter:
    """The adapter for ``config.model_type``; ValidationError naming the supported ones otherwise."""
    model_type = getattr(config, "model_type", None)
    adapter = ADAPTERS.get(model_type)  # type: ignore[arg-type]
    if adapter is None:
        raise ValidationError(
            f"unsupported architecture model_type={model_type!r}; expertcache collect supports "
            f"{', '.join(sorted(ADAPTERS))} (add a RouterAdapter to expertcache.collect.adapters for others)",
            field="model_type")
    return adapter


@dataclass(frozen=True)
class MoELayer:
    """One MoE layer found in a model: trace layer ``index`` = position among MoE layers."""

    index: int
    decoder_layer: int
    name: str
    router: Any
    experts: Any


_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def find_moe_layers(model: Any, adapter: RouterAdapter) -> list[MoELayer]:
    """The model's routers of ``adapter.router_class``, in decoder-layer order.

    Raises
    ------
    ValidationError
        If the model has no such router (no MoE layers), or a router's expert
        count / top-k disagrees with the config.
    """
    found: list[tuple[int, str, Any]] = []
    modules = dict(model.named_modules())
    for name, module in modules.items():
        if type(module).__name__ != adapter.router_class:
            continue
        match = _LAYER_RE.search(name)
        if match is None:
            raise ValidationError(f"router {name!r} is not inside a numbered decoder layer", field="model")
        found.append((int(match.group(1)), name, module))
    if not found:
        raise ValidationError(
            f"the model has no MoE layers: no {adapter.router_class} module found "
            f"(all layers dense? check mlp_only_layers / first_k_dense_replace / decoder_sparse_step)",
            field="model")
    found.sort(key=lambda t: t[0])
    config = model.config
    N, k = adapter.n_experts(config), adapter.top_k(config)
    layers = []
    for i, (dec, name, module) in enumerate(found):
        for attr, want in (("num_experts", N), ("top_k", k)):
            got = getattr(module, attr, want)
            if got != want:
                raise ValidationError(f"router {name!r} has {attr}={got}, config says {want}", field="model")
        parent = modules.get(name.rsplit(".", 1)[0]) if "." in name else None
        experts = getattr(parent, adapter.experts_attr, None) if parent is not None else None
        layers.append(MoELayer(i, dec, name, module, experts))
    return layers
