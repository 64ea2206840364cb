"""Training loops for the Cache-Learning Routers (CLR §3.4, §4.1).

Two data sources share one loop (AdamW, linear warmup then cosine decay,
decoupled weight decay, gradient clipping, gradient accumulation, bf16
autocast where available, safetensors checkpoints, exact resume):

- :func:`train_model` — a Hugging Face MoE model on local JSON Lines text;
  the objective is ``L_LM + s_w * L_cache`` with hooks capturing each MoE
  block's input and native router logits (modes in :data:`~.config.MODES`);
- :func:`train_offline` — auxiliary-only training from a collected trace's
  hidden states and router logits, without the model (cheap; the first step
  for users). The backbone is frozen by construction, so only ``aux-*`` modes
  are accepted.

Determinism: micro-batch ``m`` of epoch ``e`` takes a slice of a permutation
drawn from ``numpy.random.default_rng([seed, e])``; torch is seeded from
``seed``; a checkpoint stores the optimizer state and torch's RNG state, and
the learning rate is a pure function of the step. So stopping after ``k``
steps and resuming gives the same tensors as an uninterrupted run (tested),
provided torch's kernels are deterministic: multi-threaded CPU training of an
MoE backbone is not (two 3-step runs on the example model differ in the last
bits, and 400 steps drift apart visibly); ``routers train --deterministic``
turns on ``torch.use_deterministic_algorithms`` for the run.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ValidationError
from .config import TrainConfig

__all__ = ["TrainResult", "lr_factor", "tokenize_texts", "train_model", "train_offline", "pair_rows",
           "fit_native_routers", "hit_evaluator"]


@dataclass(frozen=True)
class TrainResult:
    """What a training run did.

    Attributes
    ----------
    out
        The checkpoint directory.
    steps, total_steps
        Optimizer steps done so far, and planned.
    history
        One record per optimizer step: ``step``, ``lr``, ``loss`` and the parts (``lm``, ``cache``), and
        ``coverage``: the hard top-B coverage ``sum_e q_e 1[e in top-B(s)]`` of the trained score, the
        quantity the soft ``cache`` loss stands in for (the loss, whose top-B threshold is detached, can
        rise while the coverage improves).
    added_parameters
        Inference-time parameters the deployed routers add (temporal, plus spatio in ``full`` modes).
    seconds
        Wall time of this call.
    """

    out: str
    steps: int
    total_steps: int
    history: list[dict[str, float]] = field(default_factory=list)
    added_parameters: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain fields, for JSON."""
        return {"out": self.out, "steps": self.steps, "total_steps": self.total_steps,
                "added_parameters": self.added_parameters, "seconds": round(self.seconds, 3),
                "final": self.history[-1] if self.history else None}


def lr_factor(step: int, total: int, warmup_ratio: float) -> float:
    """Learning-rate multiplier at optimizer step ``step`` (0-based): linear warmup, then cosine to 0."""
    warm = int(math.ceil(warmup_ratio * total))
    if step < warm:
        return (step + 1) / (warm + 1)
    progress = (step - warm) / max(1, total - warm)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def _total_steps(cfg: TrainConfig, n_items: int) -> tuple[int, int]:
    per_epoch = math.ceil(n_items / cfg.batch_size)
    if cfg.max_steps is not None:
        return cfg.max_steps, per_epoch
    return max(1, math.ceil(math.ceil(cfg.epochs * per_epoch) / cfg.grad_accum)), per_epoch


def _micro_indices(cfg: TrainConfig, m: int, n_items: int, per_epoch: int) -> np.ndarray:
    epoch, within = divmod(m, per_epoch)
    perm = np.random.default_rng([cfg.seed, epoch]).permutation(n_items)
    return perm[within * cfg.batch_size:(within + 1) * cfg.batch_size]


def _same_run(saved: dict[str, Any], cfg: TrainConfig, source: str) -> None:
    free = {"max_steps", "epochs", "save_every"}
    a = {k: v for k, v in saved.get("config", {}).items() if k not in free}
    b = {k: v for k, v in cfg.to_dict().items() if k not in free}
    if a != b:
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        raise ValidationError(f"cannot resume: the training config differs in {diff}; resume with the "
                              "checkpoint's settings (only max_steps, epochs and save_every may change)",
                              source=source)


def _run(cfg: TrainConfig, *, routers: Any, params: list[Any], micro: Callable[[int], tuple[Any, dict]],
         n_items: int, out: str | os.PathLike[str], backbone: Any | None, meta: dict[str, Any],
         resume: str | os.PathLike[str] | None, stop_after: int | None,
         on_step: Callable[[int, int, dict], None] | None, device: Any,
         evaluate: Callable[[Any], dict[str, float]] | None = None, eval_every: int = 0) -> TrainResult:
    import torch

    from .checkpoint import load_checkpoint_into, save_checkpoint

    t0 = time.perf_counter()
    total, per_epoch = _total_steps(cfg, n_items)
    use_fused = cfg.fused == "yes" or (cfg.fused == "auto" and getattr(device, "type", "cpu") == "cuda")
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **({"fused": True} if use_fused else {}))
    history: list[dict[str, float]] = []
    step = 0
    if resume is not None:
        saved = load_checkpoint_into(resume, routers=routers, optimizer=opt, backbone=backbone)
        _same_run(saved, cfg, str(resume))
        step, history = int(saved["step"]), list(saved.get("history", []))
    else:
        torch.manual_seed(cfg.seed)
    added = routers.added_parameters(spatio=cfg.uses_spatio) if cfg.objective != "none" else 0

    def save() -> None:
        trainer = {"step": step, "total_steps": total, "config": cfg.to_dict(), "history": history,
                   "n_items": n_items, **meta}
        save_checkpoint(out, routers=routers, optimizer=opt, trainer=trainer,
                        backbone=backbone if cfg.trains_backbone else None,
                        meta={"mode": cfg.mode, "capacity": cfg.capacity, "tau": cfg.tau,
                              "added_parameters": added, **meta})

    end = total if stop_after is None else min(total, stop_after)
    while step < end:
        for g in opt.param_groups:
            g["lr"] = cfg.lr * lr_factor(step, total, cfg.warmup_ratio)
        opt.zero_grad(set_to_none=True)
        parts_sum: dict[str, float] = {}
        for a in range(cfg.grad_accum):
            loss, parts = micro(step * cfg.grad_accum + a)
            (loss / cfg.grad_accum).backward()
            for k, v in parts.items():
                parts_sum[k] = parts_sum.get(k, 0.0) + float(v) / cfg.grad_accum
        if cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        rec = {"step": step + 1, "lr": opt.param_groups[0]["lr"], **parts_sum}
        opt.step()
        step += 1
        if evaluate is not None and (step == end or (eval_every > 0 and step % eval_every == 0)):
            rec.update(evaluate(routers))
        history.append(rec)
        if on_step is not None:
            on_step(step, total, rec)
        if cfg.save_every and step % cfg.save_every == 0 and step < end:
            save()
    save()
    return TrainResult(str(out), step, total, history, added, time.perf_counter() - t0)


# --------------------------------------------------------------------------- on a model


def _autocast(cfg: TrainConfig, device: Any):
    import contextlib

    import torch

    dev = getattr(device, "type", "cpu")
    use = cfg.precision == "bf16" or (cfg.precision == "auto" and dev == "cuda" and torch.cuda.is_bf16_supported())
    return torch.autocast(dev, dtype=torch.bfloat16) if use else contextlib.nullcontext()


def tokenize_texts(tokenizer: Any, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids per text, truncated to ``max_length``; texts of fewer than 2 tokens are dropped."""
    out = []
    for t in texts:
        ids = tokenizer(t, truncation=True, max_length=max_length)["input_ids"]
        if len(ids) >= 2:
            out.append(list(ids))
    if not out:
        raise ValidationError("no training text has 2 or more tokens")
    return out


def train_model(model: Any, sequences: Sequence[Sequence[int]], cfg: TrainConfig, out: str | os.PathLike[str], *,
                pad_id: int = 0, routers: Any | None = None, resume: str | os.PathLike[str] | None = None,
                stop_after: int | None = None, on_step: Callable[[int, int, dict], None] | None = None,
                meta: dict[str, Any] | None = None, evaluate: Callable[[Any], dict[str, float]] | None = None,
                eval_every: int = 0) -> TrainResult:
    """Post-train a Hugging Face MoE model with auxiliary cache routers (CLR §3.4).

    Parameters
    ----------
    model
        A causal-LM MoE model of a supported architecture (see :mod:`.adapters`).
    sequences
        Token ids per training sequence (e.g. from :func:`tokenize_texts`).
    cfg
        The run's configuration; ``cfg.mode`` decides what trains.
    out
        Checkpoint directory (replaced atomically at every save).
    pad_id
        Token id used to right-pad micro-batches (masked out of every loss).
    routers
        Auxiliary routers to train; default: fresh copies of the native routers.
    resume
        A checkpoint to continue from (the same config; see :func:`_same_run`).
    stop_after
        Stop (and save) after this many optimizer steps in total, as if interrupted.
    on_step
        Called after every optimizer step with ``(step, total, record)``.
    evaluate, eval_every
        ``evaluate(routers)`` returns extra fields (e.g. ``{"hit": ...}`` from :func:`hit_evaluator`) merged into
        the step's record every ``eval_every`` steps and after the last step (after that step's update).
    """
    import torch

    from .modules import CacheRouters, RouterTap, cache_losses, predecessor_rows

    device = next(model.parameters()).device
    routers = (routers or CacheRouters.for_model(model)).to(device)
    if routers.n_experts <= cfg.capacity and cfg.objective != "none":
        raise ValidationError(f"capacity must be below the number of experts N = {routers.n_experts}; "
                              f"got {cfg.capacity}")
    for p in model.parameters():
        p.requires_grad_(cfg.trains_backbone)
    model.train(cfg.trains_backbone)
    params: list[Any] = list(model.parameters()) if cfg.trains_backbone else []
    if cfg.objective != "none":
        params += list(routers.temporal.parameters())
        if cfg.uses_spatio:
            params += list(routers.spatio.parameters())
    seqs = [list(s) for s in sequences]
    if not seqs:
        raise ValidationError("no training sequences")

    def micro(m: int):
        idx = _micro_indices(cfg, m, len(seqs), per_epoch)
        batch = [seqs[i] for i in idx]
        width = max(len(s) for s in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for j, s in enumerate(batch):
            ids[j, :len(s)] = torch.tensor(s, dtype=torch.long)
            mask[j, :len(s)] = 1
        ids, mask = ids.to(device), mask.to(device)
        parts: dict[str, float] = {}
        loss = torch.zeros((), device=device)
        with RouterTap(model) as tap, _autocast(cfg, device):
            if cfg.trains_backbone:
                outp = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100),
                             use_cache=False)
                loss = loss + outp.loss.float()
                parts["lm"] = float(outp.loss.detach())
            else:
                with torch.no_grad():
                    model(input_ids=ids, attention_mask=mask, use_cache=False)
            if cfg.objective != "none":
                hidden, logits = tap.stacked()
                if not cfg.trains_backbone:
                    hidden, logits = hidden.detach(), logits.detach()
                cl = cache_losses(routers, hidden, logits, predecessor_rows(mask), capacity=cfg.capacity,
                                  tau=cfg.tau, objective=cfg.objective)
                term = cl.temporal if cfg.objective == "temporal" else cl.spatio_temporal
                loss = loss + cfg.cache_weight * term if cfg.trains_backbone else loss + term
                parts["cache"] = float(term.detach())
                parts["coverage"] = _coverage(cl, cfg.objective)
        parts["loss"] = float(loss.detach())
        return loss, parts

    _, per_epoch = _total_steps(cfg, len(seqs))
    info = {"source": "model", "model_type": model.config.model_type, **(meta or {})}
    return _run(cfg, routers=routers, params=params, micro=micro, n_items=len(seqs), out=out, backbone=model,
                meta=info, resume=resume, stop_after=stop_after, on_step=on_step, device=device,
                evaluate=evaluate, eval_every=eval_every)


def hit_evaluator(trace: Any, hidden: np.ndarray, logits: np.ndarray, capacity: int, *, tie_break: str = "random",
                  seed: int = 0) -> Callable[[Any], dict[str, float]]:
    """``evaluate`` for the training loops: the live Temporal Router's Hit (%) on a held-out trace.

    The number ``routers eval`` prints in its "Temporal Router" row for a checkpoint of these weights (batch 1,
    per-request prefill, ``P = 0``; :func:`~.evaluate.temporal_hit`), so the log shows the quantity the run is
    for beside the loss of its detached-threshold surrogate. The trace's hidden states are its own backbone's:
    in the joint modes, where the backbone moves, this scores the routers on the original routing.
    """
    from .checkpoint import weights_of
    from .evaluate import temporal_hit

    if not 1 <= capacity < trace.n_experts:
        raise ValidationError(f"capacity B must be in [1, N) = [1, {trace.n_experts}) of the evaluation trace; "
                              f"got {capacity}")

    def evaluate(routers: Any) -> dict[str, float]:
        w = weights_of(routers)
        if w.temporal_w.shape[:2] != (trace.n_layers, trace.n_experts) or w.temporal_w.shape[2] != hidden.shape[2]:
            raise ValidationError(f"the evaluation trace is (L, N, d) = ({trace.n_layers}, {trace.n_experts}, "
                                  f"{hidden.shape[2]}); the routers are {tuple(w.temporal_w.shape)}")
        return {"hit": temporal_hit(trace, hidden, logits, w, capacity, tie_break=tie_break, seed=seed)}

    return evaluate


# --------------------------------------------------------------------------- offline, from a trace


def pair_rows(request: np.ndarray, position: np.ndarray) -> np.ndarray:
    """``int64[n]``: the row of the same request's previous position (any phase), or -1.

    Trace rows are grouped by request and position-sorted, so the predecessor of
    row ``r`` is ``r - 1`` when it belongs to the same request.
    """
    n = request.shape[0]
    prev = np.full(n, -1, dtype=np.int64)
    if n > 1:
        same = request[1:] == request[:-1]
        prev[1:][same] = np.arange(n - 1)[same]
    return prev


def _coverage(cl: Any, objective: str) -> float:
    """The hard coverage of the term whose soft surrogate is optimised (logged beside its loss)."""
    v = cl.coverage_temporal if objective == "temporal" else cl.coverage_spatio_temporal
    return float(v) if v is not None else float("nan")


def fit_native_routers(hidden: np.ndarray, logits: np.ndarray, *, chunk: int = 4096) -> tuple[np.ndarray, float]:
    """Recover ``W^R_l`` from a trace by least squares (``logits ~ h @ W^T``), for initialisation.

    Solves the normal equations ``(H^T H) W^T = H^T Z`` per layer in float64, accumulated
    ``chunk`` rows at a time (memory ``O(d^2)``; ~20x faster than an SVD-based ``lstsq`` on a
    Qwen3-sized layer of 30k x 2048, with the same solution to float32 precision).

    Returns the ``float32[L, N, d]`` weights and the worst per-layer relative
    residual (near float16 rounding when the native router is a bias-free
    linear map of the stored hidden state, as in every supported family but GPT-OSS).

    Raises
    ------
    ValidationError
        Fewer rows than the hidden size, or hidden states that span less than ``d``
        dimensions: the native router is not determined by the trace (pass the model).
    """
    n, L, d = hidden.shape
    if n < d:
        raise ValidationError(f"the trace has {n} rows, fewer than the hidden size d = {d}: the native routers "
                              "cannot be recovered by least squares; pass --model to copy them from the model")
    ws, worst = [], 0.0
    for l in range(L):
        gram = np.zeros((d, d))
        rhs = np.zeros((d, logits.shape[2]))
        for lo in range(0, n, chunk):
            x = hidden[lo:lo + chunk, l].astype(np.float64)
            gram += x.T @ x
            rhs += x.T @ logits[lo:lo + chunk, l].astype(np.float64)
        try:
            w = np.linalg.solve(gram, rhs)
        except np.linalg.LinAlgError:
            raise ValidationError(f"the hidden states of MoE layer {l} span fewer than d = {d} dimensions: the "
                                  "native router is not determined by the trace; pass --model to copy it") from None
        err = ref = 0.0
        for lo in range(0, n, chunk):
            y = logits[lo:lo + chunk, l].astype(np.float64)
            err += float(np.square(hidden[lo:lo + chunk, l].astype(np.float64) @ w - y).sum())
            ref += float(np.square(y).sum())
        worst = max(worst, math.sqrt(err) / max(math.sqrt(ref), 1e-30))
        ws.append(w.T.astype(np.float32))
    return np.stack(ws), worst


def train_offline(prev: np.ndarray, hidden: np.ndarray, logits: np.ndarray, cfg: TrainConfig,
                  out: str | os.PathLike[str], *, native_weights: np.ndarray, native_bias: np.ndarray | None = None,
                  kind: str = "softmax", resume: str | os.PathLike[str] | None = None, stop_after: int | None = None,
                  on_step: Callable[[int, int, dict], None] | None = None,
                  meta: dict[str, Any] | None = None, evaluate: Callable[[Any], dict[str, float]] | None = None,
                  eval_every: int = 0) -> TrainResult:
    """Auxiliary-only training from collected arrays (no model needed).

    Parameters
    ----------
    prev
        ``int64[n_tokens]``: each row's predecessor row (:func:`pair_rows`), -1 for none.
    hidden, logits
        ``(n_tokens, L, d)`` MoE-block inputs and ``(n_tokens, L, N)`` native router logits
        (float16 as collected is fine), rows aligned with the trace.
    cfg
        Must be an ``aux-*`` mode; ``batch_size`` counts (predecessor, token) pairs.
    native_weights, native_bias
        ``W^R``: ``(L, N, d)`` (and ``(L, N)``) to initialise the routers from; see
        :func:`fit_native_routers` when only the trace is at hand.
    evaluate, eval_every
        As in :func:`train_model`.
    """
    import torch

    from .modules import CacheRouters, cache_losses

    if cfg.trains_backbone:
        raise ValidationError(f"offline training freezes the backbone; use mode aux-temporal or aux-full, "
                              f"got {cfg.mode}")
    n, L, d = hidden.shape
    if logits.shape[:2] != (n, L) or prev.shape != (n,):
        raise ValidationError(f"hidden {hidden.shape}, logits {logits.shape} and prev {prev.shape} must share "
                              "(n_tokens, L)")
    N = logits.shape[2]
    if native_weights.shape != (L, N, d):
        raise ValidationError(f"native router weights must be (L, N, d) = {(L, N, d)}; got {native_weights.shape}")
    if cfg.capacity >= N:
        raise ValidationError(f"capacity must be below the number of experts N = {N}; got {cfg.capacity}")
    pairs = np.flatnonzero(prev >= 0)
    if pairs.size == 0:
        raise ValidationError("no (predecessor, token) pairs: every request has a single row")
    routers = CacheRouters.from_native(
        [torch.from_numpy(np.ascontiguousarray(w)) for w in native_weights],
        None if native_bias is None else [torch.from_numpy(np.ascontiguousarray(b)) for b in native_bias],
        kind=kind)
    params = list(routers.temporal.parameters()) + (list(routers.spatio.parameters()) if cfg.uses_spatio else [])
    _, per_epoch = _total_steps(cfg, pairs.size)

    def micro(m: int):
        r = pairs[_micro_indices(cfg, m, pairs.size, per_epoch)]
        p = prev[r]
        b = r.shape[0]
        h = torch.from_numpy(np.concatenate([hidden[r], hidden[p]]).astype(np.float32))
        lg = torch.from_numpy(np.concatenate([logits[r], logits[p]]).astype(np.float32))
        local_prev = torch.cat([torch.arange(b, 2 * b), torch.full((b,), -1)])
        cl = cache_losses(routers, h, lg, local_prev, capacity=cfg.capacity, tau=cfg.tau, objective=cfg.objective)
        term = cl.temporal if cfg.objective == "temporal" else cl.spatio_temporal
        return term, {"cache": float(term.detach()), "loss": float(term.detach()),
                      "coverage": _coverage(cl, cfg.objective)}

    info = {"source": "trace", **(meta or {})}
    return _run(cfg, routers=routers, params=params, micro=micro, n_items=int(pairs.size), out=out, backbone=None,
                meta=info, resume=resume, stop_after=stop_after, on_step=on_step, device=torch.device("cpu"),
                evaluate=evaluate, eval_every=eval_every)

