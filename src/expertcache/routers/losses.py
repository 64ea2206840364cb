"""Cache-coverage losses of the Cache-Learning Routers (CLR §3.1-§3.3).

All router outputs are distributions over the same ``N`` experts, so they are
combined by plain summation (no fusion parameters): the post-access retention
priority is ``s^T = p^R + p^T`` and the pre-access score is
``s^ST = p^S_rho + a^T`` with the carry-over ``a^T_{t,l} = s^T_{t-1,l}`` (the
priority the cache of layer ``l`` was last updated with).

Hard top-B membership is not differentiable; its soft surrogate is::

    m_e(s) = sigmoid((s_e - theta_B(s)) / tau),
    theta_B(s) = (s_(B) + s_(B+1)) / 2          (B-th and (B+1)-th largest, no gradient)

The summary of CLR we work from states the surrogate's role and its
temperature (Qwen3 tau = 0.03, GPT-OSS tau = 0.05) but not its formula; this
one is the standard sigmoid relaxation around the top-B boundary. As
``tau -> 0`` it tends to the indicator of the top-B set whenever
``s_(B) > s_(B+1)`` (tested). With ``B >= N`` every expert fits and ``m = 1``.

The coverage loss weights the miss surrogate by a full target distribution
``q`` (dense supervision near the routing boundary)::

    ell(s, q) = sum_e q_e * (1 - m_e(s))

averaged over (token, layer) positions. ``q`` is teacher-forced and carries no
gradient.
"""

from __future__ import annotations

import torch

__all__ = ["soft_topb_membership", "hard_topb_membership", "coverage_loss", "native_distribution"]


def soft_topb_membership(score: torch.Tensor, capacity: int, tau: float) -> torch.Tensor:
    """Soft top-B membership ``m(s)`` over the last axis.

    Parameters
    ----------
    score
        ``float[..., N]`` priority scores.
    capacity
        ``B``, the number of experts a layer's cache holds (``>= 1``).
    tau
        Temperature (``> 0``); smaller is closer to hard membership.

    Returns
    -------
    torch.Tensor
        ``float[..., N]`` in ``(0, 1)``; ones when ``B >= N``.
    """
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1; got {capacity}")
    if not tau > 0:
        raise ValueError(f"tau must be > 0; got {tau}")
    n = score.shape[-1]
    if capacity >= n:
        return torch.ones_like(score)
    top = torch.topk(score.detach(), capacity + 1, dim=-1).values
    theta = 0.5 * (top[..., capacity - 1] + top[..., capacity])
    return torch.sigmoid((score - theta.unsqueeze(-1)) / tau)


def hard_topb_membership(score: torch.Tensor, capacity: int) -> torch.Tensor:
    """The indicator of the ``capacity`` largest scores (ties by lower index), as floats."""
    n = score.shape[-1]
    out = torch.zeros_like(score)
    idx = torch.topk(score, min(capacity, n), dim=-1).indices
    return out.scatter_(-1, idx, 1.0)


def coverage_loss(score: torch.Tensor, target: torch.Tensor, capacity: int, tau: float) -> torch.Tensor:
    """Mean over rows of ``sum_e target_e * (1 - m_e(score))`` (a scalar; zero for no rows)."""
    if score.shape[0] == 0:
        return score.sum() * 0.0
    m = soft_topb_membership(score, capacity, tau)
    return (target.detach() * (1.0 - m)).sum(-1).mean()


def native_distribution(logits: torch.Tensor, kind: str) -> torch.Tensor:
    """``p^R`` from router logits in float32: softmax, or normalised sigmoid scores (DeepSeek-V3)."""
    x = logits.float()
    if kind == "softmax":
        return torch.softmax(x, dim=-1)
    if kind == "sigmoid":
        s = torch.sigmoid(x)
        return s / s.sum(-1, keepdim=True)
    raise ValueError(f"native kind must be 'softmax' or 'sigmoid'; got {kind!r}")
