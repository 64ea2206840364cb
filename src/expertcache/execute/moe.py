"""Finding and re-pointing a transformers MoE layer's routed experts (needs torch).

Every architecture of :data:`expertcache.collect.ADAPTERS` in transformers 5.x keeps its routed
experts in one ``*Experts`` module whose parameters are stacked over the expert dimension
(``gate_up_proj [N, 2I, H]``, ``down_proj [N, H, I]``, GPT-OSS also ``*_bias [N, .]``) and whose
forward ``(hidden_states, top_k_index, top_k_weights)`` reads ``self.num_experts``. The executor
replaces those parameters with the device tier's slot tensors ``[S, ...]``, sets ``num_experts = S``
and calls the module's **own** forward (whatever experts implementation the model selected:
``grouped_mm``, ``batched_mm`` or ``eager``) with ``top_k_index`` remapped from expert ids to slot
ids. :func:`expert_parameters` refuses layouts this does not hold for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import ValidationError

__all__ = ["expert_parameters", "PatchedExperts"]


def expert_parameters(experts: Any, n_experts: int) -> list[str]:
    """Names of ``experts``' own parameters stacked over the ``N`` experts (leading dimension ``N``).

    Raises
    ------
    ValidationError
        If the module holds its experts some other way (e.g. a ``ModuleList`` of MLPs), has a
        parameter not stacked over experts, or does not read ``num_experts``.
    """
    if experts is None:
        raise ValidationError("the MoE layer has no 'experts' module beside its router; expertcache execute "
                              "needs the stacked-experts layout of transformers 5.x", field="model")
    params = list(experts.named_parameters(recurse=False))
    names = [n for n, p in params if p.dim() >= 2 and p.shape[0] == n_experts]
    other = [n for n, p in params if n not in names]
    if not names or other or any(True for _ in experts.children()) and not names:
        raise ValidationError(f"{type(experts).__name__} does not stack its weights over the {n_experts} experts "
                              f"(parameters {', '.join(n for n, _ in params) or 'none'}); expertcache execute "
                              "supports the stacked layout of transformers 5.x", field="model")
    if getattr(experts, "num_experts", None) != n_experts:
        raise ValidationError(f"{type(experts).__name__}.num_experts is {getattr(experts, 'num_experts', None)}, "
                              f"the config says {n_experts}", field="model")
    return names


class PatchedExperts:
    """One MoE layer's experts module, re-pointed at slot tensors; :meth:`restore` undoes it.

    ``handler(hidden_states, top_k_index, top_k_weights, call_own)`` replaces the forward;
    ``call_own(slot_tensors, n_slots, hidden, slot_index, weights)`` runs the module's own forward
    on slot tensors.
    """

    def __init__(self, experts: Any, names: list[str], handler: Callable[..., torch.Tensor]) -> None:
        self.experts = experts
        self.names = names
        self.original = {n: getattr(experts, n) for n in names}
        self.num_experts = experts.num_experts
        self.own_forward = type(experts).forward
        for n in names:
            delattr(experts, n)           # drop the Parameter; slot tensors are set per call
            setattr(experts, n, self.original[n].data)   # keep a valid attribute until the tier is built
        patched = self

        def forward(hidden_states, top_k_index, top_k_weights, *args, **kwargs):
            if args or kwargs:
                raise ValidationError(f"{type(experts).__name__}.forward got extra arguments; expertcache execute "
                                      "supports forward(hidden_states, top_k_index, top_k_weights)", field="model")
            return handler(hidden_states, top_k_index, top_k_weights, patched.call_own)

        experts.forward = forward

    def call_own(self, tensors: dict[str, torch.Tensor], n_slots: int, hidden: torch.Tensor,
                 index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The module's own forward over ``tensors`` (``[n_slots, ...]`` each) with slot ids ``index``."""
        ex = self.experts
        for n in self.names:
            object.__setattr__(ex, n, tensors[n])
        ex.num_experts = n_slots
        try:
            return self.own_forward(ex, hidden, index, weights)
        finally:
            ex.num_experts = self.num_experts

    def detach_weights(self) -> None:
        """Drop the module's reference to the full expert tensors (they now live in the host tier)."""
        for n in self.names:
            object.__setattr__(self.experts, n, None)

    def restore(self) -> None:
        """Put the original parameters and forward back (not possible once the tensors were released)."""
        ex = self.experts
        if not self.original:
            raise RuntimeError("the original expert tensors were released (host tier mmap); reload the model")
        del ex.forward
        for n in self.names:
            if n in ex.__dict__:
                del ex.__dict__[n]
            ex.register_parameter(n, self.original[n])
        ex.num_experts = self.num_experts
