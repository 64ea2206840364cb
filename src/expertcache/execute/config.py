"""Execution parameters of ``expertcache execute``: one frozen, validated record."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ValidationError
from ..events import ArrivalOffsets

__all__ = ["ExecuteConfig", "CONTRACTS", "HOST_TIERS", "EXPERTS_IMPLEMENTATIONS", "contract_semantics"]

#: Execution contracts and the replay semantics each must equal.
CONTRACTS = {"fused": "event-atomic", "serialized": "sequential-ascending"}
#: Host tiers: ``mmap`` the checkpoint's safetensors files memory-mapped (experts never loaded), ``ram`` a
#: CPU copy after a full load, ``auto`` mmap where the checkpoint can be mapped, else ram (reason recorded).
HOST_TIERS = ("auto", "mmap", "ram")
#: transformers experts kernels the executor runs (all read ``num_experts`` and stacked weights).
EXPERTS_IMPLEMENTATIONS = ("eager", "batched_mm", "grouped_mm")


def contract_semantics(contract: str) -> str:
    """The replay semantics that models ``contract``."""
    return CONTRACTS[contract]


@dataclass(frozen=True)
class ExecuteConfig:
    """How ``expertcache execute`` runs a model with offloaded experts.

    Attributes
    ----------
    policy
        A controller policy (:data:`expertcache.execute.controller.CONTROLLER_POLICIES`).
    rho
        Residency fraction; capacities follow the quota rule of docs/semantics.md
        (``total = floor(rho*L*N + 0.5)``, per layer ``total // L`` plus one for the first ``total % L``).
    capacity
        Explicit capacity instead of ``rho``: per layer (per-layer scope) or the pool (global scope).
    scope
        ``"per-layer"`` or ``"global"``.
    contract
        ``"fused"``: per (step, layer) the union is made resident, the tokens compute, then the policy
        retains (event-atomic). ``"serialized"``: per (step, layer) the members in ascending expert id,
        each loaded, computed and retained before the next (sequential-ascending).
    batch
        Concurrency ``B`` of FCFS continuous batching.
    offsets
        Arrival offsets of the requests.
    max_new_tokens, max_prompt_tokens, chat_template
        As in ``expertcache collect``.
    tie_break, seed, lrfu_lambda
        As in ``expertcache replay``.
    device, dtype
        Compute device (``cpu``, ``cuda``, ``cuda:1``) and model dtype.
    host_tier
        ``"mmap"`` (the model is built without its routed experts and the host tier is views into the
        memory-mapped safetensors files, so a model larger than RAM runs), ``"ram"`` (the model is
        loaded in full and its experts copied to CPU memory, pinned on CUDA), or ``"auto"`` (default:
        ``mmap`` where the checkpoint can be mapped, else ``ram`` with the reason recorded).
    experts_implementation
        transformers' experts kernel the run uses (and the reference run with it): ``"eager"``
        (default; logits bit-exact under both contracts), ``"batched_mm"`` (bit-exact fused),
        ``"grouped_mm"``, or ``None`` to keep the model's own choice (docs/execute.md, Exactness).
    """

    policy: str = "lru"
    rho: float = 0.5
    capacity: int | None = None
    scope: str = "per-layer"
    contract: str = "fused"
    batch: int = 8
    offsets: ArrivalOffsets = field(default_factory=ArrivalOffsets)
    max_new_tokens: int = 64
    max_prompt_tokens: int = 4096
    chat_template: bool = True
    tie_break: str = "random"
    seed: int = 0
    lrfu_lambda: float = 0.5
    device: str = "cpu"
    dtype: str = "auto"
    host_tier: str = "auto"
    experts_implementation: str | None = "eager"

    def __post_init__(self) -> None:
        from .controller import CONTROLLER_POLICIES

        if self.policy not in CONTROLLER_POLICIES:
            raise ValidationError(f"must be one of {', '.join(CONTROLLER_POLICIES)}; got {self.policy!r}",
                                  field="policy")
        if isinstance(self.rho, bool) or not isinstance(self.rho, (int, float)) or math.isnan(self.rho) \
                or not 0.0 <= self.rho <= 1.0:
            raise ValidationError(f"must be a number in [0, 1]; got {self.rho!r}", field="rho")
        for name, lo in (("batch", 1), ("max_new_tokens", 0), ("max_prompt_tokens", 1), ("seed", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValidationError(f"must be an integer >= {lo}; got {v!r}", field=name)
        if self.capacity is not None and (isinstance(self.capacity, bool) or not isinstance(self.capacity, int)
                                          or self.capacity < 0):
            raise ValidationError(f"must be a non-negative integer; got {self.capacity!r}", field="capacity")
        if self.scope not in ("per-layer", "global"):
            raise ValidationError(f"must be per-layer or global; got {self.scope!r}", field="scope")
        if self.contract not in CONTRACTS:
            raise ValidationError(f"must be one of {', '.join(CONTRACTS)}; got {self.contract!r}", field="contract")
        if self.tie_break not in ("random", "id"):
            raise ValidationError(f"must be random or id; got {self.tie_break!r}", field="tie_break")
        if isinstance(self.lrfu_lambda, bool) or not isinstance(self.lrfu_lambda, (int, float)) \
                or not 0.0 <= self.lrfu_lambda <= 1.0:
            raise ValidationError(f"must be a number in [0, 1]; got {self.lrfu_lambda!r}", field="lrfu_lambda")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValidationError(f"must be auto, float32, bfloat16 or float16; got {self.dtype!r}", field="dtype")
        if self.host_tier not in HOST_TIERS:
            raise ValidationError(f"must be one of {', '.join(HOST_TIERS)}; got {self.host_tier!r}",
                                  field="host_tier")
        if self.experts_implementation not in (None, *EXPERTS_IMPLEMENTATIONS):
            raise ValidationError(f"must be one of {', '.join(EXPERTS_IMPLEMENTATIONS)}; got "
                                  f"{self.experts_implementation!r}", field="experts_implementation")
        if self.policy == "predicted-next-use" and self.contract != "fused":
            raise ValidationError("predicted-next-use advice is per event-atomic unit; use --contract fused",
                                  field="contract")

    @property
    def semantics(self) -> str:
        """The replay semantics this run must equal."""
        return CONTRACTS[self.contract]

    def capacities(self, n_layers: int, n_experts: int) -> list[int]:
        """Capacity per partition (``L`` entries per-layer, one global), by the quota rule or explicit."""
        if self.capacity is not None:
            return [self.capacity] if self.scope == "global" else [self.capacity] * n_layers
        total = int(math.floor(self.rho * n_layers * n_experts + 0.5))
        if self.scope == "global":
            return [total]
        return [total // n_layers + (1 if l < total % n_layers else 0) for l in range(n_layers)]

    def to_dict(self) -> dict[str, Any]:
        """The parameters as a JSON-ready dict."""
        d = asdict(self)
        d["offsets"] = self.offsets.describe()
        d["offsets_seed"] = self.offsets.seed
        return d
