"""Forward hooks on the routers of a transformers MoE model (needs torch).

The hook stores references to the router's own outputs ``(logits, weights,
indices)`` for every forward call, with no computation and no device sync, so
generation runs at nearly full speed; statistics are computed once per batch
afterwards (:func:`router_stats`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ValidationError
from .adapters import MoELayer

__all__ = ["RouterRecorder", "router_stats", "RouterStats"]


class RouterRecorder:
    """Context manager recording every router call of ``layers``.

    After a run, ``calls[l]`` holds one ``(logits, weights, indices, hidden)``
    tuple per forward of the model, in call order (``hidden`` is ``None``
    unless ``save_hidden``). Each tensor is flattened over batch x time.
    """

    def __init__(self, layers: list[MoELayer], save_hidden: bool = False) -> None:
        self.layers = layers
        self.save_hidden = save_hidden
        self.calls: list[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]]] = [
            [] for _ in layers]
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> RouterRecorder:
        for layer in self.layers:
            self._handles.append(layer.router.register_forward_hook(self._hook(layer.index), with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def clear(self) -> None:
        """Drop the recorded calls (between batches)."""
        for c in self.calls:
            c.clear()

    def _hook(self, index: int):
        calls = self.calls[index]
        save_hidden = self.save_hidden

        def hook(module, args, kwargs, output):
            if not (isinstance(output, tuple) and len(output) == 3):
                raise ValidationError(
                    f"router {type(module).__name__} returned {type(output).__name__}; expected "
                    "(router_logits, topk_weights, topk_indices) as in transformers 5.x", field="model")
            hidden = None
            if save_hidden:
                x = args[0] if args else kwargs["hidden_states"]
                hidden = x.detach().reshape(-1, x.shape[-1]).to(torch.float16)
            calls.append((output[0].detach(), output[1].detach(), output[2].detach(), hidden))

        return hook


@dataclass(frozen=True)
class RouterStats:
    """Per-token router statistics of one layer (CPU tensors, rows = tokens).

    ``probs``: probability of each selected expert ``[n, k]``; ``entropy``: nats ``[n]``;
    ``margin``: largest minus second-largest probability over all experts ``[n]``.
    """

    probs: torch.Tensor
    entropy: torch.Tensor
    margin: torch.Tensor


def router_probabilities(logits: torch.Tensor, score: str) -> torch.Tensor:
    """Router distribution over all ``N`` experts (float32): softmax, or normalised sigmoid."""
    x = logits.float()
    if score == "softmax":
        return torch.softmax(x, dim=-1)
    s = torch.sigmoid(x)
    return s / s.sum(dim=-1, keepdim=True).clamp_min(1e-30)


def router_stats(logits: torch.Tensor, indices: torch.Tensor, score: str) -> RouterStats:
    """Probabilities of the selected experts, entropy and margin of each row of ``logits``."""
    p = router_probabilities(logits, score)
    sel = p.gather(-1, indices.long())
    entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    if p.shape[-1] >= 2:
        top2 = torch.topk(p, 2, dim=-1).values
        margin = top2[..., 0] - top2[..., 1]
    else:
        margin = p[..., 0]
    return RouterStats(sel, entropy, margin)
