"""``execute``: run a prompt set under one or more configs and write the run directory (needs torch).

Layout (docs/execute.md)::

    OUT/execute.json            kind, model, prompts, every config, the summaries, the reference check
    OUT/reference/trace/        the unmodified model's recording (also the advice of belady / belady-forced)
    OUT/calibration/            the static policy's calibration stream (when given)
    OUT/<run>/trace/            the routing this run executed (read_trace, report)
    OUT/<run>/events/           the stream it presented to its cache (expertcache replay)
    OUT/<run>/counts.json       per layer and phase: hits, misses, initial load; replay's prediction
    OUT/<run>/timings.parquet   every copy, MoE layer and forward, in nanoseconds
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import ValidationError
from ..events import EventStream
from ..storage import atomic_directory, json_text
from .config import ExecuteConfig
from .stream import executed_stream

__all__ = ["execute", "ExecuteRun", "replay_prediction", "run_name", "KIND"]

KIND = "expertcache-execute"


@dataclass(frozen=True)
class ExecuteRun:
    """The outcome of :func:`execute`: the directory and one summary per config."""

    out: Path
    summaries: tuple[dict[str, Any], ...]
    reference: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        return {"out": str(self.out), "runs": list(self.summaries), "reference": self.reference}


def run_name(config: ExecuteConfig, configs: Sequence[ExecuteConfig]) -> str:
    """Directory name of a run: the policy, plus what else differs among ``configs``."""
    parts = [config.policy]
    for attr in ("contract", "rho", "capacity", "scope", "batch"):
        if len({getattr(c, attr) for c in configs}) > 1:
            parts.append(f"{attr}{getattr(config, attr)}")
    return "-".join(str(p) for p in parts)


def replay_prediction(result: Any, calibration: EventStream | None = None, advice: Any = None
                      ) -> tuple[Any, Any]:
    """``expertcache replay`` of the run's recorded trace under the run's config: ``(ReplayResult, stream)``."""
    from ..replay import ReplayConfig, replay

    cfg: ExecuteConfig = result.config
    ex = executed_stream(result.trace, cfg.batch, cfg.offsets)
    L = result.trace.n_layers
    caps = cfg.capacities(L, result.trace.n_experts)
    rcfg = ReplayConfig(policy=cfg.policy, scope=cfg.scope, semantics=cfg.semantics, tie_break=cfg.tie_break,
                        seed=cfg.seed, lrfu_lambda=cfg.lrfu_lambda,
                        capacity=caps[0] if cfg.scope == "global" else tuple(caps))
    return replay(ex.stream, rcfg, calibration=calibration, advice=advice), ex


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ValidationError(f"{out} is a file; -o takes a directory this command creates", field="out")
    if out.exists():
        if not overwrite:
            raise ValidationError(f"{out} already exists; choose another -o or pass --overwrite", field="out")
        try:
            kind = json.loads((out / "execute.json").read_text()).get("kind")
        except (OSError, ValueError):
            kind = None
        if kind != KIND:
            raise ValidationError(f"{out} was not written by expertcache execute (no execute.json); "
                                  "--overwrite only replaces a run directory of this command", field="out")


def execute(model_id: str, prompts: str | os.PathLike[str], out: str | os.PathLike[str],
            configs: Sequence[ExecuteConfig], *, calibration: EventStream | None = None,
            advice_from: str | os.PathLike[str] | None = None, advice: Any = None, reference: bool = True,
            overwrite: bool = False, progress: Callable[[str, int, int], None] | None = None) -> ExecuteRun:
    """Execute ``prompts`` on ``model_id`` once per config and write ``out`` (see the module docstring).

    Parameters
    ----------
    model_id
        A local model directory (or a Hub id in the local cache).
    prompts
        Prompts JSONL (as for ``expertcache collect``).
    out
        Run directory to create.
    configs
        One :class:`ExecuteConfig` per run; they must share batching, offsets, token limits,
        device, dtype and experts implementation (one reference run serves them all).
    calibration
        The static policy's calibration stream.
    advice_from
        A trace directory recorded earlier on the same prompts; ``belady`` / ``belady-forced`` take
        their next uses from it (default: this command's own reference recording).
    advice
        ``predicted-next-use``: an :class:`expertcache.nextuse.Advice`.
    reference
        Also run the unmodified model and compare every run's tokens and logits with it.
    overwrite
        Replace ``out`` if it is a run directory of this command.
    progress
        ``progress(run_name, requests_done, requests_total)``.
    """
    import torch

    from ..collect import CollectConfig, read_prompts
    from ..collect.runner import encode_prompt, load_tokenizer, load_weights
    from ..trace import read_trace
    from .runner import Executor

    if not configs:
        raise ValidationError("no configuration to execute", field="policy")
    base = configs[0]
    shared = ("batch", "offsets", "max_new_tokens", "max_prompt_tokens", "chat_template", "device", "dtype",
              "experts_implementation")
    for c in configs[1:]:
        for a in shared:
            if getattr(c, a) != getattr(base, a):
                raise ValidationError(f"all runs of one execute call share {a}; got {getattr(base, a)!r} and "
                                      f"{getattr(c, a)!r}", field=a)
    out = Path(out)
    _check_out(out, overwrite)
    records = read_prompts(prompts)
    ccfg = CollectConfig(max_new_tokens=base.max_new_tokens, max_prompt_tokens=base.max_prompt_tokens,
                         chat_template=base.chat_template, dtype=base.dtype,
                         device=None if base.device == "cpu" else base.device)
    tokenizer = load_tokenizer(model_id, ccfg)
    encoded = [encode_prompt(tokenizer, r, ccfg)[0] for r in records]
    request_ids = [r.request_id for r in records]
    cpu_cfg = replace(ccfg, device=None)

    def load() -> Any:
        return load_weights(model_id, cpu_cfg)

    def load_for(cfg: ExecuteConfig) -> tuple[Any, Any, str | None]:
        """``(model, host tier or None, why auto fell back to ram)``: mmap builds the model without experts."""
        if cfg.host_tier == "ram":
            return load(), None, None
        from .checkpoint import UnmappableCheckpoint, load_offloaded

        try:
            model, host = load_offloaded(model_id, base.dtype)
        except UnmappableCheckpoint as e:
            if cfg.host_tier == "mmap":
                raise
            return load(), None, str(e)
        return model, host, None

    names = [run_name(c, configs) for c in configs]
    if len(set(names)) != len(names):
        raise ValidationError("two runs of this call would write the same directory; vary one setting at a time",
                              field="policy")
    summaries = []
    ref_summary = None
    with atomic_directory(out, overwrite=overwrite) as tmp:
        ref = None
        eos = None
        if reference or any(c.policy in ("belady", "belady-forced") for c in configs) and advice_from is None:
            model = load()
            from .runner import _eos_ids

            eos = _eos_ids(model, tokenizer)
            ref = Executor(model, replace(base, policy="lru"), eos_token_ids=eos, offload=False,
                           keep_logits=reference).run(encoded, request_ids,
                                                      progress=(lambda d, n: progress("reference", d, n))
                                                      if progress else None)
            ref.trace.save(tmp / "reference" / "trace")
            ref_summary = {k: v for k, v in ref.summary().items() if not k.startswith("memory_")}
            del model
        advice_trace = read_trace(advice_from) if advice_from is not None else (ref.trace if ref else None)
        if calibration is not None:
            calibration.save(tmp / "calibration")
        for cfg, name in zip(configs, names, strict=True):
            model, host, fallback = load_for(cfg)
            if eos is None:
                from .runner import _eos_ids

                eos = _eos_ids(model, tokenizer)
            adv_stream = (executed_stream(advice_trace, cfg.batch, cfg.offsets).stream
                          if cfg.policy in ("belady", "belady-forced") and advice_trace is not None else None)
            ex = Executor(model, cfg, eos_token_ids=eos, calibration=calibration, advice_stream=adv_stream,
                          advice=advice, keep_logits=reference, host=host)
            res = ex.run(encoded, request_ids,
                         progress=(lambda d, n, name=name: progress(name, d, n)) if progress else None)
            pred, exs = replay_prediction(res, calibration, advice)
            d = tmp / name
            res.trace.save(d / "trace")
            exs.stream.save(d / "events")
            from .timings import write_timings

            write_timings(d / "timings.parquet", res.timings)
            per_layer_ok = [
                (x.hits, x.misses, x.initial_load) == (p.hits, p.demand_misses, p.initial_load)
                for x, p in zip(res.per_layer, pred.per_layer, strict=True)]
            if fallback is not None:
                res.memory["host_tier_fallback"] = fallback
            summary = res.summary()
            summary.update({"run": name, "rho": cfg.rho, "replay_transferred": pred.transferred,
                            "replay_hits": pred.hits, "replay_equal_per_layer": all(per_layer_ok),
                            "replay_semantics": cfg.semantics})
            if ref is not None:
                summary["tokens_equal_reference"] = res.generated == ref.generated
                if reference:
                    same = len(res.logits) == len(ref.logits) and all(
                        a.shape == b.shape and torch.equal(a, b) for a, b in zip(res.logits, ref.logits, strict=True))
                    summary["logits_bit_exact"] = bool(same)
                    summary["logits_max_abs_diff"] = (float(max((a - b).abs().max() for a, b in
                                                                zip(res.logits, ref.logits, strict=True)))
                                                      if not same and len(res.logits) == len(ref.logits) else
                                                      (0.0 if same else None))
            counts = {"config": cfg.to_dict(), "summary": summary,
                      "per_layer": [x.to_dict() for x in res.per_layer],
                      "replay_per_layer": [{"layer": p.layer, "capacity": p.capacity, "hits": p.hits,
                                            "demand_misses": p.demand_misses, "initial_load": p.initial_load,
                                            "union": p.union} for p in pred.per_layer],
                      "memory": res.memory,
                      "event_log_columns": ["forward", "layer", "phase", "hits", "misses"],
                      "event_log": res.event_log.tolist()}
            (d / "counts.json").write_text(json_text(counts, indent=1))
            summaries.append(summary)
            del model, host, ex, res
        (tmp / "execute.json").write_text(json_text({
            "kind": KIND, "model": model_id, "prompts": os.path.basename(os.fspath(prompts)),
            "runs": summaries, "reference": ref_summary,
            "configs": {n: c.to_dict() for n, c in zip(names, configs, strict=True)}}, indent=1))
    return ExecuteRun(out, tuple(summaries), ref_summary)

