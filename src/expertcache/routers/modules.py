"""Temporal and Spatio Routers, their initialisation, and hooks into a Hugging Face MoE model (CLR §3.2-§3.3).

Per MoE layer ``l`` (``L`` layers, ``N`` experts, hidden size ``d``):

- the **Temporal Router** ``W^T_l`` (a ``d -> N`` linear map, initialised from
  the native router ``W^R_l``) reads ``h(t, l)``, the input of layer ``l``'s
  MoE block, and gives ``p^T_{t,l}``, a guess at the same layer's demand at
  the next decode step;
- the **Spatio Router** ``W^S_l`` (initialised from ``W^R_{l+1}``, with
  ``W^S_{L-1} <- W^R_0``) reads ``h(t, l)`` and gives ``p^S`` for the causal
  successor of ``(t, l)``: ``(t, l+1)``, or ``(t+1, 0)`` from the last layer.
  So the score of target ``(t, l)`` comes from its predecessor
  ``rho(t, l) = (t, l-1)`` or ``(t-1, L-1)``.

Deviation, stated: CLR's spatio router reads the predecessor's *output*; we
read the predecessor's MoE-block input (the normalised hidden state its native
router sees). It is equally available before ``(t, l)`` starts, it is the
scale ``W^R_{l+1}`` was trained on (so the initialisation is meaningful), and
it is what a collected trace stores, so online and offline training see the
same features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .adapters import find_native_routers, native_kind
from .losses import coverage_loss, hard_topb_membership, native_distribution

__all__ = ["CacheRouters", "RouterTap", "CacheLosses", "cache_losses", "predecessor_rows"]


class CacheRouters(nn.Module):
    """The auxiliary routers of one model: ``temporal[l]`` and ``spatio[l]``, ``l < L``.

    Parameters
    ----------
    n_layers, n_experts, d_model
        ``L``, ``N`` and the hidden size.
    bias
        Whether the linear maps have a bias (GPT-OSS's router has one).
    kind
        How native logits become ``p^R``: ``"softmax"`` or ``"sigmoid"`` (DeepSeek-V3).
    """

    def __init__(self, n_layers: int, n_experts: int, d_model: int, *, bias: bool = False,
                 kind: str = "softmax") -> None:
        super().__init__()
        self.n_layers, self.n_experts, self.d_model, self.kind = n_layers, n_experts, d_model, kind
        self.temporal = nn.ModuleList(nn.Linear(d_model, n_experts, bias=bias) for _ in range(n_layers))
        self.spatio = nn.ModuleList(nn.Linear(d_model, n_experts, bias=bias) for _ in range(n_layers))

    @classmethod
    def from_native(cls, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None] | None = None,
                    *, kind: str = "softmax") -> CacheRouters:
        """Initialise ``W^T_l <- W^R_l`` and ``W^S_l <- W^R_{(l+1) mod L}`` (CLR §4.1).

        ``weights[l]`` is the native router weight of MoE layer ``l``, ``(N, d)``;
        ``biases[l]`` its bias or ``None``. Copies are float32 and detached.
        """
        L = len(weights)
        N, d = weights[0].shape
        has_bias = biases is not None and biases[0] is not None
        out = cls(L, int(N), int(d), bias=has_bias, kind=kind)
        with torch.no_grad():
            for l in range(L):
                out.temporal[l].weight.copy_(weights[l].float())
                out.spatio[l].weight.copy_(weights[(l + 1) % L].float())
                if has_bias:
                    out.temporal[l].bias.copy_(biases[l].float())
                    out.spatio[l].bias.copy_(biases[(l + 1) % L].float())
        return out

    @classmethod
    def for_model(cls, model: Any) -> CacheRouters:
        """Routers for a Hugging Face MoE model, initialised from its native routers."""
        natives = find_native_routers(model)
        ws = [n.router.weight.detach() for n in natives]
        bs = [getattr(n.router, "bias", None) for n in natives]
        bs = [b.detach() if isinstance(b, torch.Tensor) else None for b in bs]
        return cls.from_native(ws, bs if bs[0] is not None else None, kind=native_kind(model))

    def added_parameters(self, spatio: bool = True) -> int:
        """Inference-time parameters added to the model: temporal only, or temporal + spatio."""
        n = sum(p.numel() for p in self.temporal.parameters())
        return n + (sum(p.numel() for p in self.spatio.parameters()) if spatio else 0)

    def temporal_dist(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        """``p^T`` (float32) of layer ``layer`` from its MoE-block input ``h[..., d]``."""
        return torch.softmax(self.temporal[layer](h.to(self.temporal[layer].weight.dtype)).float(), dim=-1)

    def spatio_dist(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        """``p^S`` (float32) for the successor of layer ``layer``, from layer ``layer``'s MoE-block input."""
        return torch.softmax(self.spatio[layer](h.to(self.spatio[layer].weight.dtype)).float(), dim=-1)


class RouterTap:
    """Forward hooks that capture each MoE layer's block input and router logits.

    A forward pre-hook on every MoE block records its input ``h`` (flattened to
    ``(tokens, d)``) and a forward hook on its router records the logits
    (the router's first output). The captured tensors stay in the autograd
    graph, so the cache loss can reshape the native router in joint training.
    Use as a context manager; hooks are removed on exit.
    """

    def __init__(self, model: Any) -> None:
        self.natives = find_native_routers(model)
        self.kind = native_kind(model)
        self.hidden: list[torch.Tensor | None] = [None] * len(self.natives)
        self.logits: list[torch.Tensor | None] = [None] * len(self.natives)
        self._handles: list[Any] = []

    def __enter__(self) -> RouterTap:
        for nr in self.natives:
            l = nr.layer

            def pre(_module, args, kwargs, l=l):
                x = args[0] if args else next(iter(kwargs.values()))
                self.hidden[l] = x.reshape(-1, x.shape[-1])

            def post(_module, _args, output, l=l):
                logits = output[0] if isinstance(output, tuple) else output
                self.logits[l] = logits.reshape(-1, logits.shape[-1])

            self._handles.append(nr.block.register_forward_pre_hook(pre, with_kwargs=True))
            self._handles.append(nr.router.register_forward_hook(post))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(H, logits)``: ``(tokens, L, d)`` and ``(tokens, L, N)`` from the last forward pass."""
        if any(x is None for x in self.hidden) or any(x is None for x in self.logits):
            raise RuntimeError("RouterTap: no forward pass captured every MoE layer")
        return torch.stack(self.hidden, dim=1), torch.stack(self.logits, dim=1)  # type: ignore[arg-type]


def predecessor_rows(attention_mask: torch.Tensor) -> torch.Tensor:
    """For flattened ``(batch, seq)`` tokens: the row of the previous token of the same sequence, or -1."""
    b, s = attention_mask.shape
    rows = torch.arange(b * s, device=attention_mask.device).reshape(b, s)
    prev = torch.full((b, s), -1, dtype=torch.long, device=attention_mask.device)
    ok = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
    prev[:, 1:] = torch.where(ok, rows[:, :-1], prev[:, 1:])
    return prev.reshape(-1)


@dataclass(frozen=True)
class CacheLosses:
    """The cache losses of one batch (scalars; a term not requested is ``None``)."""

    temporal: torch.Tensor | None
    spatio_temporal: torch.Tensor | None
    n_pairs: int
    #: Hard coverage ``mean sum_e q_e * 1[e in top-B(s)]`` of each requested term (no gradient): the quantity
    #: the soft loss stands in for; it can improve while the surrogate loss rises.
    coverage_temporal: float | None = None
    coverage_spatio_temporal: float | None = None


def cache_losses(routers: CacheRouters, hidden: torch.Tensor, logits: torch.Tensor, prev: torch.Tensor,
                 *, capacity: int, tau: float, objective: str) -> CacheLosses:
    """``L_T`` and/or ``L_ST`` over (predecessor, token) pairs, averaged over pairs and layers.

    Parameters
    ----------
    hidden
        ``(n, L, d)``: MoE-block inputs ``h(row, l)``.
    logits
        ``(n, L, N)``: native router logits of the same rows.
    prev
        ``int64[n]``: the previous decode step of the same sequence, or -1.
    objective
        ``"temporal"`` (``L_T``: ``s^T`` at the previous step vs ``q = p^R`` now),
        ``"full"`` (``L_ST``: ``s^ST = p^S_rho + s^T_{t-1}`` vs ``q = p^R`` now) or ``"both"``.
    """
    have = torch.nonzero(prev >= 0).squeeze(-1)
    p = prev[have]
    L = routers.n_layers
    lt: list[torch.Tensor] = []
    lst: list[torch.Tensor] = []
    ct: list[float] = []
    cst: list[float] = []

    def hard(score: torch.Tensor, q: torch.Tensor) -> float:
        if score.shape[0] == 0:
            return 0.0
        with torch.no_grad():
            return float((q * hard_topb_membership(score.detach(), capacity)).sum(-1).mean())

    for l in range(L):
        q = native_distribution(logits[have, l], routers.kind).detach()
        s_t_prev = native_distribution(logits[p, l], routers.kind) + routers.temporal_dist(hidden[p, l], l)
        if objective in ("temporal", "both"):
            lt.append(coverage_loss(s_t_prev, q, capacity, tau))
            ct.append(hard(s_t_prev, q))
        if objective in ("full", "both"):
            src = hidden[have, l - 1] if l > 0 else hidden[p, L - 1]
            s_st = routers.spatio_dist(src, (l - 1) % L) + s_t_prev
            lst.append(coverage_loss(s_st, q, capacity, tau))
            cst.append(hard(s_st, q))
    return CacheLosses(torch.stack(lt).mean() if lt else None, torch.stack(lst).mean() if lst else None,
                       int(have.numel()), sum(ct) / len(ct) if ct else None, sum(cst) / len(cst) if cst else None)
