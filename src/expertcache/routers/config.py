"""Training configuration of the Cache-Learning Routers (CLR §3.4, §4.1); no torch needed."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import ValidationError

__all__ = ["MODES", "TrainConfig"]

#: Training modes (CLR §3.4, Tab. 2):
#:
#: - ``lm-only``: the reference, ``s_w = 0``; backbone trained on ``L_LM``, no auxiliary routers used.
#: - ``temporal``: backbone + Temporal Routers on ``L_LM + s_w * L_T``.
#: - ``full``: backbone + Temporal and Spatio Routers on ``L_LM + s_w * L_ST`` (no separate ``L_T``).
#: - ``aux-temporal`` / ``aux-full``: the same cache objective with the backbone frozen
#:   (auxiliary-only); ``L_LM`` has no trainable parameter and is not computed.
MODES = ("lm-only", "temporal", "full", "aux-temporal", "aux-full")


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on (defaults: CLR's Qwen3 setting, §4.1).

    Attributes
    ----------
    mode
        One of :data:`MODES`.
    capacity
        ``B``: experts per layer the cache holds (the top-B surrogate's size); ``1 <= B < N``.
    tau
        Temperature of the soft top-B surrogate (Qwen3 0.03, GPT-OSS 0.05).
    cache_weight
        ``s_w``: weight of the cache loss in ``L_LM + s_w * L_cache`` (ignored by ``lm-only``).
    lr
        Peak learning rate of AdamW.
    weight_decay
        AdamW decoupled weight decay.
    warmup_ratio
        Fraction of the optimizer steps spent in linear warmup before cosine decay to zero.
    max_grad_norm
        Gradient clipping norm (``0`` disables clipping).
    grad_accum
        Micro-batches per optimizer step.
    batch_size
        Sequences per micro-batch (padded to the longest).
    epochs
        Passes over the data (fractional allowed); ignored when ``max_steps`` is set.
    max_steps
        Optimizer steps to run in total (``None``: from ``epochs``).
    max_length
        Tokens per training sequence (longer ones are truncated).
    precision
        ``"auto"`` (bf16 autocast on CUDA when supported, else fp32), ``"bf16"`` or ``"fp32"``.
    fused
        ``"auto"`` (fused AdamW on CUDA), ``"yes"`` or ``"no"``.
    seed
        Seeds the data order (per epoch) and torch; resuming replays the same order.
    save_every
        Write a checkpoint every this many optimizer steps (``0``: only at the end).
    """

    mode: str = "temporal"
    capacity: int = 20
    tau: float = 0.03
    cache_weight: float = 0.10
    lr: float = 1.0e-5
    weight_decay: float = 0.10
    warmup_ratio: float = 0.03
    max_grad_norm: float = 1.0
    grad_accum: int = 8
    batch_size: int = 1
    epochs: float = 4.0
    max_steps: int | None = None
    max_length: int = 512
    precision: str = "auto"
    fused: str = "auto"
    seed: int = 0
    save_every: int = 0

    def __post_init__(self) -> None:
        def need(ok: bool, what: str, got: Any) -> None:
            if not ok:
                raise ValidationError(f"{what}; got {got!r}")

        need(self.mode in MODES, f"mode must be one of {', '.join(MODES)}", self.mode)
        need(isinstance(self.capacity, int) and self.capacity >= 1, "capacity must be an integer >= 1",
             self.capacity)
        need(self.tau > 0, "tau must be > 0", self.tau)
        need(self.cache_weight >= 0, "cache_weight must be >= 0", self.cache_weight)
        need(self.lr > 0, "lr must be > 0", self.lr)
        need(self.weight_decay >= 0, "weight_decay must be >= 0", self.weight_decay)
        need(0 <= self.warmup_ratio < 1, "warmup_ratio must be in [0, 1)", self.warmup_ratio)
        need(self.max_grad_norm >= 0, "max_grad_norm must be >= 0", self.max_grad_norm)
        need(self.grad_accum >= 1, "grad_accum must be >= 1", self.grad_accum)
        need(self.batch_size >= 1, "batch_size must be >= 1", self.batch_size)
        need(self.epochs > 0, "epochs must be > 0", self.epochs)
        need(self.max_steps is None or self.max_steps >= 1, "max_steps must be >= 1 or None", self.max_steps)
        need(self.max_length >= 2, "max_length must be >= 2", self.max_length)
        need(self.precision in ("auto", "bf16", "fp32"), "precision must be auto, bf16 or fp32", self.precision)
        need(self.fused in ("auto", "yes", "no"), "fused must be auto, yes or no", self.fused)
        need(self.save_every >= 0, "save_every must be >= 0", self.save_every)

    @property
    def trains_backbone(self) -> bool:
        """Whether backbone weights receive gradients (all but the auxiliary-only modes)."""
        return not self.mode.startswith("aux-")

    @property
    def objective(self) -> str:
        """``"none"`` (LM only), ``"temporal"`` (``L_T``) or ``"full"`` (``L_ST``)."""
        return {"lm-only": "none", "temporal": "temporal", "aux-temporal": "temporal"}.get(self.mode, "full")

    @property
    def uses_spatio(self) -> bool:
        """Whether the Spatio Routers are part of the objective (and of the deployed model)."""
        return self.objective == "full"

    def to_dict(self) -> dict[str, Any]:
        """Plain fields, for JSON."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict` (unknown keys are an error)."""
        known = set(cls.__dataclass_fields__)
        extra = set(d) - known
        if extra:
            raise ValidationError(f"unknown training-config keys {sorted(extra)}; expected a subset of {sorted(known)}")
        return cls(**d)
