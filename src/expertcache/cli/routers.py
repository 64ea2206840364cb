"""``expertcache routers train|export|eval``: Cache-Learning Routers from the command line (docs/routers.md)."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import click

from .main import _console, _csv, _echo_json, _fail, _guard, _progress, _require_extra, _require_new


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def routers() -> None:
    """Cache-Learning Routers: train Temporal/Spatio routers, export advice, evaluate (CLR)."""


def _load_model(model: str, device: str | None) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from ..errors import ValidationError

    hf_logging.disable_progress_bar()   # our own progress bar and --json own the terminal
    if not os.path.isdir(model):       # never a hub id: nothing is downloaded
        raise ValidationError("no such model directory; expected a local Hugging Face model directory "
                              "(config.json, weights, tokenizer)", source=model)
    try:
        tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
        m = AutoModelForCausalLM.from_pretrained(model, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ValidationError(f"cannot load the model ({str(exc).splitlines()[0]}); expected a local Hugging Face "
                              "model directory", source=model) from None
    if device:
        m = m.to(device)
    return m, tok


def _trace_arrays(trace_dir: str, hidden: bool = True):
    from ..collect import read_array
    from ..trace import read_trace

    trace = read_trace(trace_dir)
    return trace, read_array(trace_dir, "hidden") if hidden else None, read_array(trace_dir, "logits")


@contextlib.contextmanager
def _deterministic():
    """``torch.use_deterministic_algorithms(True)`` for the block, restored after."""
    import torch

    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def _same_shape(routers: Any, trace: Any, hidden: Any, path: str) -> None:
    got = (trace.n_layers, trace.n_experts, int(hidden.shape[2]))
    want = (int(routers.n_layers), int(routers.n_experts), int(routers.d_model))
    if got != want:
        _fail(f"--eval-trace {path} is (L, N, d) = {got}; the model's routers are {want}: evaluate on a trace "
              "collected from this model")


def _emit_train(res: Any, as_json: bool) -> None:
    if as_json:
        _echo_json(res.to_dict())
        return
    last = res.history[-1] if res.history else {}
    parts = ", ".join(f"{k} {v:.4f}" for k, v in last.items() if k not in ("step", "lr"))
    click.echo(f"wrote {res.out}: step {res.steps}/{res.total_steps}; last step {parts}; "
               f"{res.added_parameters} added parameters; {res.seconds:.1f} s")


@routers.command("train")
@click.option("--model", "model_path", default=None, help="Local Hugging Face MoE model directory.")
@click.option("--data", "data_path", type=click.Path(dir_okay=False), default=None,
              help='Training JSON Lines ("text" | "question"+"answer" | "prompt" [+ "completion"]); needs --model.')
@click.option("--trace", "trace_dir", type=click.Path(file_okay=False), default=None,
              help="Offline auxiliary-only training from a trace collected with --save-hidden --save-logits.")
@click.option("--mode", type=click.Choice(["lm-only", "temporal", "full", "aux-temporal", "aux-full"]),
              default=None, help="What trains [default: temporal with --data, aux-temporal with --trace].")
@click.option("--capacity", "-C", type=int, required=True, help="B: experts per layer the cache holds.")
@click.option("--tau", type=float, default=0.03, show_default=True, help="Soft top-B temperature.")
@click.option("--cache-weight", type=float, default=0.10, show_default=True, help="s_w in L_LM + s_w L_cache.")
@click.option("--lr", type=float, default=1e-5, show_default=True)
@click.option("--weight-decay", type=float, default=0.10, show_default=True)
@click.option("--warmup-ratio", type=float, default=0.03, show_default=True)
@click.option("--max-grad-norm", type=float, default=1.0, show_default=True)
@click.option("--grad-accum", type=int, default=8, show_default=True)
@click.option("--batch-size", type=int, default=1, show_default=True,
              help="Sequences per micro-batch (with --trace: token pairs).")
@click.option("--epochs", type=float, default=4.0, show_default=True)
@click.option("--max-steps", type=int, default=None, help="Optimizer steps (overrides --epochs).")
@click.option("--max-length", type=int, default=512, show_default=True)
@click.option("--precision", type=click.Choice(["auto", "bf16", "fp32"]), default="auto", show_default=True)
@click.option("--fused", type=click.Choice(["auto", "yes", "no"]), default="auto", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--save-every", type=int, default=0, show_default=True, help="Checkpoint every N steps (0: at the end).")
@click.option("--resume", type=click.Path(file_okay=False), default=None, help="Continue from this checkpoint.")
@click.option("--device", default=None, help="Torch device for the model (cpu, cuda).")
@click.option("--deterministic", is_flag=True,
              help="torch.use_deterministic_algorithms for this run: bit-reproducible multi-threaded CPU training "
                   "(without it two runs drift apart); on CUDA it also needs CUBLAS_WORKSPACE_CONFIG=:4096:8.")
@click.option("--model-out", type=click.Path(file_okay=False), default=None,
              help="Also save the trained backbone (joint modes) as a Hugging Face model directory, e.g. to "
                   "collect its routing.")
@click.option("--eval-trace", type=click.Path(file_okay=False), default=None,
              help="Held-out trace (collect --save-hidden --save-logits): log the Temporal Router's Hit on it, as "
                   "`routers eval` scores it (batch 1, per-request prefill, P = 0), beside the loss.")
@click.option("--eval-every", type=int, default=0, show_default=True,
              help="With --eval-trace: evaluate every N optimizer steps (0: after the last step only).")
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False), help="Checkpoint directory.")
@click.option("--overwrite", is_flag=True, help="Replace an existing checkpoint directory.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@_guard
def train_cmd(model_path: str | None, data_path: str | None, trace_dir: str | None, mode: str | None,
              capacity: int, tau: float, cache_weight: float, lr: float, weight_decay: float, warmup_ratio: float,
              max_grad_norm: float, grad_accum: int, batch_size: int, epochs: float, max_steps: int | None,
              max_length: int, precision: str, fused: str, seed: int, save_every: int, resume: str | None,
              device: str | None, deterministic: bool, model_out: str | None, eval_trace: str | None,
              eval_every: int, out: str, overwrite: bool, as_json: bool) -> None:
    """Train Temporal (and Spatio) Routers on a model and local text, or offline on a trace."""
    _require_extra("routers", "torch", "safetensors", *(("transformers",) if model_path else ()))
    from ..routers.config import TrainConfig

    if (data_path is None) == (trace_dir is None):
        _fail("give exactly one of --data (train on a model) or --trace (offline, auxiliary-only)")
    if data_path is not None and model_path is None:
        _fail("--data needs --model")
    if resume is None or resume != out:
        _require_new(out, overwrite)
    if model_out is not None:
        if data_path is None or (mode or "temporal").startswith("aux-"):
            _fail("--model-out needs a joint mode (lm-only, temporal, full) with --data: only they change the backbone")
        _require_new(model_out, overwrite)
    if eval_every < 0:
        _fail(f"--eval-every takes N >= 0 optimizer steps; got {eval_every}")
    if eval_every and eval_trace is None:
        _fail("--eval-every needs --eval-trace (the held-out trace the Hit is measured on)")
    evaluate = None
    if eval_trace is not None:
        from ..routers.train import hit_evaluator

        ev_trace, ev_hidden, ev_logits = _trace_arrays(eval_trace)   # a bad trace fails before any training
        evaluate = hit_evaluator(ev_trace, ev_hidden, ev_logits, capacity, seed=seed)
    cfg = TrainConfig(mode=mode or ("temporal" if data_path else "aux-temporal"), capacity=capacity, tau=tau,
                      cache_weight=cache_weight, lr=lr, weight_decay=weight_decay, warmup_ratio=warmup_ratio,
                      max_grad_norm=max_grad_norm, grad_accum=grad_accum, batch_size=batch_size, epochs=epochs,
                      max_steps=max_steps, max_length=max_length, precision=precision, fused=fused, seed=seed,
                      save_every=save_every)
    with _progress() as bar, (_deterministic() if deterministic else contextlib.nullcontext()):
        task = bar.add_task("training", total=None)

        def tick(step: int, total: int, rec: dict) -> None:
            bar.update(task, completed=step, total=total)

        if data_path is not None:
            from ..routers.data import load_texts
            from ..routers.train import tokenize_texts, train_model

            texts = load_texts(data_path)      # a bad file fails before the model loads
            model, tok = _load_model(model_path, device)  # type: ignore[arg-type]
            if eval_trace is not None:
                from ..routers.modules import CacheRouters

                _same_shape(CacheRouters.for_model(model), ev_trace, ev_hidden, eval_trace)
            seqs = tokenize_texts(tok, texts, cfg.max_length)
            pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
            res = train_model(model, seqs, cfg, out, pad_id=int(pad), resume=resume, on_step=tick,
                              meta={"model": model_path, "data": data_path, "deterministic": deterministic},
                              evaluate=evaluate, eval_every=eval_every)
            if model_out is not None:
                from ..storage import atomic_directory

                with atomic_directory(model_out, overwrite=overwrite) as tmp:
                    model.save_pretrained(tmp)
                    tok.save_pretrained(tmp)
        else:
            import numpy as np

            from ..routers.train import fit_native_routers, pair_rows, train_offline

            trace, hidden, logits = _trace_arrays(trace_dir)  # type: ignore[arg-type]
            if eval_trace is not None and (ev_trace.n_layers, ev_trace.n_experts, ev_hidden.shape[2]) != \
                    (trace.n_layers, trace.n_experts, hidden.shape[2]):
                _fail(f"--eval-trace {eval_trace} is (L, N, d) = ({ev_trace.n_layers}, {ev_trace.n_experts}, "
                      f"{ev_hidden.shape[2]}); the training trace is ({trace.n_layers}, {trace.n_experts}, "
                      f"{hidden.shape[2]}): evaluate on a trace of the same model")
            meta: dict[str, Any] = {"trace": trace_dir, "deterministic": deterministic}
            if model_path is not None:
                from ..routers.modules import CacheRouters

                model, _ = _load_model(model_path, None)
                r = CacheRouters.for_model(model)
                w = np.stack([lin.weight.detach().numpy() for lin in r.temporal])
                b = (np.stack([lin.bias.detach().numpy() for lin in r.temporal])
                     if r.temporal[0].bias is not None else None)
                kind = r.kind
                meta["init"] = f"native routers of {model_path}"
            else:
                w, resid = fit_native_routers(hidden, logits)
                b, kind = None, str(trace.provenance.get("router_score", "softmax"))
                meta["init"] = f"least-squares fit of the trace's logits (relative residual {resid:.2e})"
            res = train_offline(pair_rows(trace.request, trace.position), hidden, logits, cfg, out,
                                native_weights=w, native_bias=b, kind=kind, resume=resume, on_step=tick, meta=meta,
                                evaluate=evaluate, eval_every=eval_every)
    _emit_train(res, as_json)


def _advice(checkpoint: str, trace_dir: str, batch: int, offsets: str, seed: int, uses: tuple[str, ...],
            stream_for: Any = None) -> tuple[Any, Any, Any, dict[str, Any]]:
    """Load the trace once and compute the advice of each ``use`` ("routers", "native") layer by layer.

    ``stream_for(trace, offsets)`` builds the stream to check the advice against (or returns ``None``).
    Returns ``(trace, stream, weights, {use: RouterAdvice})``.
    """
    from ..events import ArrivalOffsets
    from ..routers.advice import router_advice
    from ..routers.checkpoint import load_router_weights

    weights = load_router_weights(checkpoint)
    trace, hidden, logits = _trace_arrays(trace_dir, hidden="routers" in uses)   # native needs logits only
    offs = ArrivalOffsets.parse(offsets, seed=seed)
    stream = stream_for(trace, offs) if stream_for is not None else None
    out = {}
    with _progress() as bar:
        for use in uses:
            task = bar.add_task(f"advice ({use})", total=trace.n_layers)
            out[use] = router_advice(trace, hidden, logits, weights, batch, offs, stream=stream, use=use,
                                     provenance={"checkpoint": checkpoint, "trace": trace_dir},
                                     progress=lambda i, n, task=task: bar.update(task, completed=i, total=n))
    return trace, stream, weights, out


@routers.command("export")
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False))
@click.option("--trace", "trace_dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="Trace with hidden states and router logits (collect --save-hidden --save-logits).")
@click.option("--batch", type=int, default=1, show_default=True, help="Concurrency B of the FCFS schedule.")
@click.option("--offsets", default="zero", show_default=True, help="Arrival offsets, as in `events build`.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of random offsets.")
@click.option("--stream", "stream_dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="The stream the advice is for (checked; its prefill warm-up is padded).")
@click.option("--use", type=click.Choice(["routers", "native"]), default="routers", show_default=True,
              help="routers: s^T and s^ST; native: p^R alone (reference).")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="Advice .npz to write.")
@click.option("--overwrite", is_flag=True, help="Replace an existing file.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@_guard
def export_cmd(checkpoint: str, trace_dir: str, batch: int, offsets: str, seed: int, stream_dir: str | None,
               use: str, out: str, overwrite: bool, as_json: bool) -> None:
    """Write per-event priority / prefetch-score advice of CHECKPOINT for a trace's event stream."""
    _require_extra("routers", "safetensors")
    import numpy as np

    from ..events import read_events
    from ..routers.advice import save_router_advice
    from ..storage import atomic_file

    _require_new(out, overwrite, file=True)
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        _fail(f"{out}: the folder {folder} does not exist; create it or choose another path")
    stream = read_events(stream_dir) if stream_dir else None
    adv = _advice(checkpoint, trace_dir, batch, offsets, seed, (use,), lambda *_: stream)[3][use]
    with atomic_file(out) as tmp:
        save_router_advice(adv, tmp)
    info = {"out": out, "n_events": int(adv.priority.shape[0]), "n_experts": int(adv.priority.shape[1]),
            "warmup_events": adv.warmup_events,
            "events_with_prefetch_candidates": 0 if adv.prefetch_score is None else
            int(np.isfinite(adv.prefetch_score).any(1).sum()),
            **adv.provenance}
    if as_json:
        _echo_json(info)
    else:
        click.echo(f"wrote {out}: {info['n_events']} events x {info['n_experts']} experts "
                   f"({info['events_with_prefetch_candidates']} with pre-access candidates)")


def _table(rows: list, title: str) -> None:
    from rich.table import Table

    t = Table(title=title)
    in_bytes = bool(rows) and rows[0].load_unit == "bytes/token"
    load_col = "Load (MB/token)" if in_bytes else "Load (blocks/token)"
    for col in ("method", "category", "B", "R", "added params", "acc", "Hit", "AdjHit", load_col, "P", "m",
                "decision availability"):
        t.add_column(col, justify="left" if col in ("method", "category", "decision availability") else "right")
    for r in rows:
        load = r.load_per_token / 1e6 if in_bytes else r.load_per_token
        t.add_row(r.method, r.category, str(r.capacity), str(r.budget), f"{r.added_parameters:,}",
                  "-" if r.accuracy is None else f"{100 * r.accuracy:.2f}", f"{100 * r.hit:.2f}",
                  f"{100 * r.adj_hit:.2f}", f"{load:.3f}", str(r.proactive_loads), f"{r.miss_fraction:.4f}",
                  r.availability)
    _console().print(t)


@routers.command("eval")
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False))
@click.option("--trace", "trace_dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="Held-out trace with hidden states and router logits.")
@click.option("--capacity", "-C", type=int, required=True, help="B: experts per layer the cache holds.")
@click.option("--budget", type=int, default=0, show_default=True,
              help="R: pre-access candidates for the Spatio-Temporal row (0: no such row).")
@click.option("--sweep-budget", "budgets", callback=_csv(int, "integers"), default=None,
              help="Also replay this checkpoint at each R (CLR Table 3), e.g. 0,2,4.")
@click.option("--sweep-capacity", "capacities", callback=_csv(int, "integers"), default=None,
              help="Also LRU vs Temporal Router at each B (CLR Table 3), e.g. 2,3,4,5.")
@click.option("--batch", type=int, default=1, show_default=True, help="Concurrency of the FCFS schedule.")
@click.option("--offsets", default="zero", show_default=True, help="Arrival offsets, as in `events build`.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of offsets and random ties.")
@click.option("--prefill-init/--no-prefill-init", default=True, show_default=True,
              help="CLR §4.1: each request's prompt is replayed (not counted) just before its decode, the protocol "
                   "of `prefetch compare`; at --batch > 1, the first batch's prefill warms the cache instead.")
@click.option("--prefill-chunk", type=int, default=128, show_default=True)
@click.option("--tie-break", type=click.Choice(["random", "id"]), default="random", show_default=True)
@click.option("--reference", is_flag=True,
              help="Add a row with U_B on the native p^R alone (the Temporal Router at initialisation).")
@click.option("--expert-bytes", type=int, default=None,
              help="S_expert for Load/token [default: the trace's expert_block_bytes (collect records it), "
                   "else Load/token is in blocks].")
@click.option("--baselines", "baselines_dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Add the MoE caching / prefetch baselines of `prefetch compare` (MoE-Infinity, ProMoE, FineMoE, "
                   "TE-MoE and the references) to the same table, their predictors fitted on this trace (e.g. the "
                   "routers' training trace); batch 1 with per-request prefill only.")
@click.option("--tasks", "tasks_path", type=click.Path(dir_okay=False), default=None,
              help="GSM8K-format JSON Lines for exact match (needs --model).")
@click.option("--model", "model_path", default=None, help="The base model (the checkpoint's backbone is loaded in).")
@click.option("--max-new-tokens", type=int, default=256, show_default=True)
@click.option("--device", default=None)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@_guard
def eval_cmd(checkpoint: str, trace_dir: str, capacity: int, budget: int, budgets: list[int] | None,
             capacities: list[int] | None, batch: int, offsets: str, seed: int, prefill_init: bool,
             prefill_chunk: int, tie_break: str, reference: bool, expert_bytes: int | None,
             baselines_dir: str | None, tasks_path: str | None,
             model_path: str | None, max_new_tokens: int, device: str | None, as_json: bool) -> None:
    """CLR Table 1-shaped results of CHECKPOINT on a held-out trace (and Table 3 sweeps)."""
    _require_extra("routers", "safetensors", *(("torch", "transformers") if model_path else ()))
    from ..events import ArrivalOffsets, build_events
    from ..routers import evaluate as ev

    if tasks_path and not model_path:
        _fail("--tasks needs --model")
    if baselines_dir and not (prefill_init and batch == 1):
        _fail("--baselines scores the prefetch baselines under the per-request prefill protocol: use --batch 1 "
              "with --prefill-init (the defaults)")
    if budget < 0 or any(r < 0 for r in budgets or ()):
        _fail(f"--budget and --sweep-budget take R >= 0 pre-access candidates; got {budget} and {budgets}")
    tasks = None
    if tasks_path:
        from ..routers.data import load_tasks

        tasks = load_tasks(tasks_path)         # a bad file fails before any work

    def stream_for(trace: Any, offs: Any) -> Any:
        for b in [capacity, *(capacities or ())]:   # before the advice is computed
            if not 1 <= b < trace.n_experts:
                _fail(f"capacity B must be in [1, N) = [1, {trace.n_experts}); got {b}")
        if prefill_init and batch > 1:
            from ..events.prefill import prefill_initialised_events

            return prefill_initialised_events(trace, batch, prefill_chunk, "chunk-major", offs)
        return build_events(trace, batch, offs)   # batch 1: laid out per request below

    trace, stream, weights, advs = _advice(checkpoint, trace_dir, batch, offsets, seed,
                                           ("routers", "native") if reference else ("routers",), stream_for)
    adv, native = advs["routers"], advs.get("native")
    offs = ArrivalOffsets.parse(offsets, seed=seed)
    mask = None
    protocol = "cold cache, every decode event counted"
    if prefill_init and batch == 1:
        if offs.kind != "zero":
            _fail("the per-request prefill protocol (batch 1) serves requests in input order; use --offsets zero "
                  "or --no-prefill-init")
        stream, mask, adv = ev.per_request_prefill(trace, adv)
        if native is not None:
            native = ev.per_request_prefill(trace, native)[2]
        protocol = "per-request prefill-initialised decode (CLR §4.1): each prompt replayed, uncounted, before its decode"
    elif prefill_init:
        protocol = f"the first batch's prefill warms the cache ({adv.warmup_events} events, uncounted)"
    if expert_bytes is None and isinstance(trace.provenance.get("expert_block_bytes"), int):
        expert_bytes = int(trace.provenance["expert_block_bytes"])
    L, N, d = weights.temporal_w.shape
    per = N * d + (N if weights.temporal_b is not None else 0)
    acc: dict[str, float] = {}
    accuracy_info = None
    if tasks is not None:
        from ..routers.checkpoint import BACKBONE_FILE

        model, tok = _load_model(model_path, device)  # type: ignore[arg-type]
        joint = os.path.isfile(os.path.join(checkpoint, BACKBONE_FILE))
        if joint:
            from safetensors.torch import load_model

            load_model(model, os.path.join(checkpoint, BACKBONE_FILE))
        with _progress() as bar:
            t = bar.add_task("exact match", total=len(tasks))
            res = ev.exact_match(model, tok, tasks, max_new_tokens=max_new_tokens,
                                 progress=lambda i, n: bar.update(t, completed=i, total=n))
        accuracy_info = res.to_dict()
        names = ["Temporal Router", "Spatio-Temporal Router", "Native p^R (untrained)"] + (
            [] if joint else ["LRU", "LFU", "LRFU"])
        acc = {k: res.accuracy for k in names}
    with _progress() as bar:
        t = bar.add_task("replays", total=None)
        rows = ev.results_table(stream, adv, capacity, budget, added_temporal=L * per, added_full=2 * L * per,
                                expert_bytes=expert_bytes, tie_break=tie_break, seed=seed, accuracy=acc,
                                native=native, progress=lambda i, n: bar.update(t, completed=i, total=n),
                                count_mask=mask)
        r_rows = ev.budget_sweep(stream, adv, capacity, budgets, expert_bytes=expert_bytes, tie_break=tie_break,
                                 seed=seed, count_mask=mask) if budgets else []
        b_rows = ev.capacity_sweep(stream, adv, capacities, expert_bytes=expert_bytes, tie_break=tie_break,
                                   seed=seed, count_mask=mask) if capacities else []
        if baselines_dir:
            from ..collect import read_array
            from ..errors import ValidationError
            from ..trace import read_trace

            try:
                h_eval, h_cal = read_array(trace_dir, "hidden"), read_array(baselines_dir, "hidden")
            except ValidationError:
                h_eval = h_cal = None          # both sides or neither: routing-derived features
            r_base = budget if budget > 0 else int(round(0.75 * capacity))
            rows += ev.baseline_rows(trace, read_trace(baselines_dir), capacity, r_base, expert_bytes=expert_bytes,
                                     tie_break=tie_break, seed=seed, hidden=h_eval, hidden_calibration=h_cal)
    from ..analysis.concentration import concentration, selection_counts

    conc = concentration(selection_counts(trace), min(8, trace.n_experts))
    scope = {"checkpoint": checkpoint, "mode": weights.meta.get("mode"), "trained_capacity": weights.meta.get("capacity"),
             "trace": trace_dir, "batch": batch, "offsets": offs.describe(), "protocol": protocol,
             "warmup_events": int((~mask).sum()) if mask is not None else adv.warmup_events,
             "decode_events": int(mask.sum()) if mask is not None else stream.n_events - adv.warmup_events,
             "expert_bytes": expert_bytes,
             "concentration": {"max_expert_frequency": conc.overall_max_frequency,
                               "top8_mass": conc.overall_topk_mass, "entropy_nats": conc.overall_entropy,
                               "effective_experts": conc.overall_effective_experts},
             "note": ("auxiliary-only checkpoint: every row replays the same routing" if not str(
                 weights.meta.get("mode", "")).startswith(("temporal", "full", "lm")) else
                 "joint checkpoint: the classic rows replay this checkpoint's routing, not an LM-only backbone's")}
    mode = str(weights.meta.get("mode", ""))
    if mode == "lm-only":
        scope["note"] += "; lm-only: its routers were never trained (router rows = their initialisation)"
    elif mode in ("temporal", "aux-temporal") and (budget > 0 or any(r > 0 for r in budgets or ())):
        scope["note"] += (f"; {mode}: its Spatio Routers were not trained, so the R > 0 rows use their "
                          "initialisation W^S_l = W^R_(l+1)")
    if as_json:
        _echo_json({"scope": scope, "accuracy": accuracy_info, "table": [r.to_dict() for r in rows],
                    "budget_sweep": [r.to_dict() for r in r_rows],
                    "capacity_sweep": [r.to_dict() for r in b_rows]})
        return
    click.echo(f"{scope['decode_events']} decode events counted, {scope['warmup_events']} prefill events replayed "
               f"uncounted; batch {batch}; protocol: {protocol}; {scope['note']}")
    c = scope["concentration"]
    click.echo(f"concentration (CLR Figs. 2-3, decode routing, mean over layers): max expert frequency "
               f"{c['max_expert_frequency']:.2%}, top-8 mass {c['top8_mass']:.2%}, entropy {c['entropy_nats']:.3f} "
               f"nats, effective experts {c['effective_experts']:.1f} of {N}")
    _table(rows, f"CLR Table 1 shape (B = {capacity})")
    if r_rows:
        _table(r_rows, f"budget R sweep on one checkpoint (B = {capacity})")
    if b_rows:
        _table(b_rows, "capacity B sweep (update-only)")
