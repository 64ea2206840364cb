"""The ``expertcache`` command line: each command parses, calls the library, prints.

Errors a user can cause print one line (``error: FILE: record N: field 'F': …``)
on stderr and exit with status 2; no output directory is left behind.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import click

from . import __version__
from .errors import ExpertCacheError

EXIT_USER_ERROR = 2


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_USER_ERROR)


def _require_new(out: str, overwrite: bool) -> None:
    """Refuse an existing output before any work (the write itself is atomic too)."""
    import os

    if os.path.exists(out) and not overwrite:
        _fail(f"{out}: output already exists; choose another path or pass --overwrite")


def _guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn package errors into a one-line message and exit status 2."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ExpertCacheError as exc:
            _fail(str(exc))
        except OSError as exc:  # unreadable input, full disk: the user's environment, not a bug
            _fail(f"{exc.filename or ''}: {exc.strerror or exc}")

    return wrapper


def _csv(kind: type, name: str) -> Callable[[click.Context, click.Parameter, str], list]:
    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> list | None:
        if value is None:
            return None
        items = [v.strip() for v in str(value).split(",") if v.strip()]
        if not items:
            raise click.BadParameter(f"expected a comma-separated list of {name}")
        try:
            return [kind(v) for v in items]
        except ValueError:
            raise click.BadParameter(f"expected a comma-separated list of {name}; got {value!r}") from None
    return parse


def _console():
    """Rich console for tables: the terminal's width, or 160 columns when piped (no truncated cells)."""
    from rich.console import Console

    probe = Console()
    return probe if probe.is_terminal else Console(width=160)


def _rho_list(ctx: click.Context, param: click.Parameter, value: str) -> list[float]:
    """Parse ``0.4``, ``0.2,0.3,0.4`` or a range ``START:STOP:STEP`` (inclusive), mixed with commas."""
    out: list[float] = []
    for item in (v.strip() for v in str(value).split(",")):
        if not item:
            continue
        try:
            if ":" in item:
                start, stop, step = (float(x) for x in item.split(":"))
                if step <= 0 or stop < start:
                    raise ValueError
                n = int(round((stop - start) / step)) + 1
                out.extend(round(start + i * step, 10) for i in range(n))
            else:
                out.append(float(item))
        except ValueError:
            raise click.BadParameter(f"expected numbers or START:STOP:STEP ranges; got {item!r}") from None
    if not out:
        raise click.BadParameter("expected at least one residency fraction")
    return out


def _progress(total_hint: int | None = None):
    """A Rich progress bar on stderr when it is a terminal; a no-op otherwise."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True, disable=not console.is_terminal)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="expertcache")
def main() -> None:
    """Measure Mixture-of-Experts expert caching honestly.

    Pipeline: routing trace -> event stream (FCFS continuous batching) ->
    event-atomic replay -> counts. Start with `expertcache demo`.
    """


# ----------------------------------------------------------------------------- trace
@main.group()
def trace() -> None:
    """Routing traces: import and inspect."""


@trace.command("import")
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--format", "fmt", type=click.Choice(["routes-jsonl", "mixtral-jsonl", "deepseek-csv"]),
              default="routes-jsonl", show_default=True,
              help="routes-jsonl: this project's records (DESIGN.md §3); mixtral-jsonl: one row per (request, "
                   "token, layer) as published for Mixtral-8x7B; deepseek-csv: per-prompt CSV files "
                   "'Layer ID,Batch Number,Token,Activated Expert IDs' as published for DeepSeek-V2-Lite.")
@click.option("--layers", "-L", type=int, default=None, help="MoE layers L (required for routes-jsonl; "
              "inferred for the foreign formats when omitted).")
@click.option("--experts", "-N", type=int, default=None, help="Routed experts per layer N (inferred: max id + 1, "
              "a lower bound).")
@click.option("--top-k", "-k", type=int, default=None, help="Experts per token k (inferred: the commonest row length).")
@click.option("--phase", type=click.Choice(["decode", "prefill"]), default="decode", show_default=True,
              help="mixtral-jsonl: the phase of rows without their own 'phase' field.")
@click.option("--prefill-batches", type=int, default=1, show_default=True,
              help="deepseek-csv: the first N batches of each file are the prompt (prefill).")
@click.option("--skip-bad-rows", is_flag=True, help="Foreign formats: count and skip unreadable rows instead of "
              "stopping at the first.")
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False), help="Trace directory to create.")
@click.option("--model", default=None, help="Model id recorded in the manifest's provenance.")
@click.option("--json", "as_json", is_flag=True, help="Print the import report as JSON.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output directory.")
@_guard
def trace_import(sources: tuple[str, ...], fmt: str, layers: int | None, experts: int | None, top_k: int | None,
                 phase: str, prefill_batches: int, skip_bad_rows: bool, out: str, model: str | None,
                 as_json: bool, overwrite: bool) -> None:
    """Import SOURCES (routing records) into a trace directory."""
    import os

    _require_new(out, overwrite)
    prov = {"source": [os.path.basename(s) for s in sources], "format": fmt}
    if model:
        prov["model"] = model
    report = None
    if fmt == "routes-jsonl":
        from .trace import import_routes_jsonl

        if len(sources) != 1 or None in (layers, experts, top_k):
            _fail("--format routes-jsonl takes one file and needs --layers, --experts and --top-k")
        prov["source"] = prov["source"][0]
        tr = import_routes_jsonl(sources[0], layers, experts, top_k, provenance=prov)
    elif fmt == "mixtral-jsonl":
        from .importers import import_mixtral_jsonl

        if len(sources) != 1:
            _fail(f"--format mixtral-jsonl takes one file; got {len(sources)}")
        tr, report = import_mixtral_jsonl(sources[0], n_layers=layers, n_experts=experts, top_k=top_k, phase=phase,
                                          skip_bad_rows=skip_bad_rows, provenance=prov)
    else:
        from .importers import import_deepseek_csv

        tr, report = import_deepseek_csv(list(sources), n_layers=layers, n_experts=experts, top_k=top_k,
                                         prefill_batches=prefill_batches, skip_bad_rows=skip_bad_rows,
                                         provenance=prov)
    tr.save(out, overwrite=overwrite)
    if as_json:
        click.echo(json.dumps({"out": out, "n_requests": tr.n_requests, "n_tokens": tr.n_tokens,
                               "report": report.to_dict() if report else None}, sort_keys=True))
        return
    click.echo(f"wrote {out}: {tr.n_requests} requests, {tr.n_tokens} tokens, "
               f"L={tr.n_layers} N={tr.n_experts} k={tr.top_k}")
    if report is not None:
        inferred = ", ".join(report.inferred) or "nothing"
        click.echo(f"inferred: {inferred}" + (" (N = max id + 1 is a lower bound; pass --experts)"
                                             if report.n_experts_is_lower_bound else ""))
        click.echo(f"dropped: {report.n_incomplete_steps} incomplete steps, {report.n_bad_rows} bad rows; "
                   f"{report.n_position_gaps} requests with position gaps")
        for line in (*report.incomplete_examples, *report.bad_row_examples, *report.notes):
            click.echo(f"  {line}")


@trace.command("info")
@click.argument("trace_dir", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@_guard
def trace_info(trace_dir: str, as_json: bool) -> None:
    """Validate TRACE_DIR and summarise it."""
    from .trace import DECODE, read_trace

    tr = read_trace(trace_dir)
    info = {"n_layers": tr.n_layers, "n_experts": tr.n_experts, "top_k": tr.top_k, "n_requests": tr.n_requests,
            "n_tokens": tr.n_tokens, "n_decode_tokens": int((tr.phase == DECODE).sum()),
            "has_gates": tr.gates is not None, "has_token_ids": bool((tr.token_id >= 0).any()),
            "provenance": tr.provenance}
    if as_json:
        click.echo(json.dumps(info, sort_keys=True))
        return
    for key, value in info.items():
        click.echo(f"{key:16s} {value}")


# ---------------------------------------------------------------------------- events
@main.group()
def events() -> None:
    """Event streams: build from a trace, import, inspect."""


@events.command("build")
@click.argument("trace_dir", type=click.Path())
@click.option("--batch", "-B", type=int, required=True, help="Concurrency B (max active requests per step).")
@click.option("--offsets", default="zero", show_default=True,
              help="Arrival offsets: zero, stagger:D (request i arrives at i*D) or random:LO:HI (seeded).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of random offsets.")
@click.option("--prefill-init", is_flag=True,
              help="Prefill-initialised cache (CLR §4.1): prepend the chunked prefill of the first batch as "
                   "warm-up events, which replay fills the cache with but does not count.")
@click.option("--prefill-chunk", type=int, default=128, show_default=True, help="Prefill chunk size in tokens.")
@click.option("--prefill-order", type=click.Choice(["chunk-major", "layer-major"]), default="chunk-major",
              show_default=True, help="Execution order of the warm-up prefill.")
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False), help="Stream directory to create.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output directory.")
@_guard
def events_build(trace_dir: str, batch: int, offsets: str, seed: int, prefill_init: bool, prefill_chunk: int,
                 prefill_order: str, out: str, overwrite: bool) -> None:
    """Schedule the decode routing of TRACE_DIR under FCFS continuous batching."""

    from .events import ArrivalOffsets, build_events
    from .trace import read_trace

    _require_new(out, overwrite)
    if batch < 1:
        _fail(f"--batch must be a positive integer; got {batch}")
    offs = ArrivalOffsets.parse(offsets, seed=seed)
    if prefill_init:
        from .prefill import prefill_initialised_events

        stream = prefill_initialised_events(read_trace(trace_dir), batch, prefill_chunk, prefill_order, offs)
    else:
        stream = build_events(read_trace(trace_dir), batch, offs)
    stream.save(out, overwrite=overwrite)
    warm = int(stream.provenance.get("warmup_events", 0))
    click.echo(f"wrote {out}: {stream.n_events} events, union {stream.union}, logical {stream.logical} "
               f"(union/logical {stream.union / stream.logical:.4f})"
               + (f"; the first {warm} are prefill warm-up events (not counted by replay)" if warm else ""))


@events.command("import")
@click.argument("events_jsonl", type=click.Path(dir_okay=False))
@click.option("--layers", "-L", type=int, required=True, help="MoE layers L.")
@click.option("--experts", "-N", type=int, required=True, help="Routed experts per layer N.")
@click.option("--top-k", "-k", type=int, required=True, help="Experts per token k.")
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False), help="Stream directory to create.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output directory.")
@_guard
def events_import(events_jsonl: str, layers: int, experts: int, top_k: int, out: str, overwrite: bool) -> None:
    """Import EVENTS_JSONL (event records, DESIGN.md §3), e.g. a hand-written stream."""

    from .events import import_events_jsonl

    _require_new(out, overwrite)
    stream = import_events_jsonl(events_jsonl, layers, experts, top_k)
    stream.save(out, overwrite=overwrite)
    click.echo(f"wrote {out}: {stream.n_events} events, union {stream.union}, logical {stream.logical}")


@events.command("info")
@click.argument("stream_dir", type=click.Path())
@click.option("--rho", type=float, default=0.4, show_default=True, help="Residency fraction for the event ratio.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@_guard
def events_info(stream_dir: str, rho: float, as_json: bool) -> None:
    """Validate STREAM_DIR and summarise it, with the event ratio r = |E|/c_l (§6.1)."""
    import numpy as np

    from .analysis import regime_stats
    from .events import read_events

    if not 0.0 <= rho <= 1.0:
        _fail(f"--rho must be in [0, 1]; got {rho}")
    s = read_events(stream_dir)
    rg = regime_stats(s, rho)
    info = {"n_layers": s.n_layers, "n_experts": s.n_experts, "top_k": s.top_k, "n_events": s.n_events,
            "n_steps": int(np.unique(s.step).shape[0]), "union": s.union, "logical": s.logical,
            "union_over_logical": s.union / s.logical, "mean_union": rg.union_mean,
            "p95_union": rg.union_p95, "rho": rho, "mean_event_ratio": rg.r_mean,
            "fraction_events_over_capacity": rg.r_fraction_over_1, "provenance": s.provenance}
    if as_json:
        click.echo(json.dumps(info, sort_keys=True))
        return
    for key, value in info.items():
        click.echo(f"{key:30s} {value:.4f}" if isinstance(value, float) else f"{key:30s} {value}")


# ---------------------------------------------------------------------------- replay
def _policy_help() -> str:
    from .replay.policies import POLICIES  # no numba: the registry is plain data

    return "Comma list of: " + ", ".join(POLICIES) + "."


@main.command("replay")
@click.argument("stream_dir", type=click.Path())
@click.option("--policy", "-p", "policies", default="lru", show_default=True, callback=_csv(str, "policy names"),
              help=_policy_help())
@click.option("--rho", "rhos", default="0.4", show_default=True, callback=_rho_list,
              help="Residency fraction(s) of the L*N block universe: a comma list and/or START:STOP:STEP "
                   "ranges, e.g. 0.05:0.95:0.05. Stack policies (lru, least-stale, lfu, lfru, belady) "
                   "compute a whole per-layer curve in one pass.")
@click.option("--scope", type=click.Choice(["per-layer", "global"]), default="per-layer", show_default=True)
@click.option("--semantics", "semantics", default="event-atomic", show_default=True,
              callback=_csv(str, "semantics"),
              help="Comma list: event-atomic, sequential-ascending, sequential-random.")
@click.option("--tie-break", type=click.Choice(["random", "id"]), default="random", show_default=True,
              help="random: per-block priority from --seed; id: lower id retained.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of tie ranks and random order.")
@click.option("--calibration", type=click.Path(), default=None,
              help="Stream directory the 'static' policy fits its pin list on (a disjoint trace).")
@click.option("--lfu-in-cache-counters", is_flag=True, help="LFU counters restart on eviction.")
@click.option("--lrfu-lambda", type=float, default=0.5, show_default=True,
              help="LRFU decay lambda in [0, 1] (0: LFU-like, 1: LRU-like).")
@click.option("--warmup-events", type=int, default=None,
              help="Leading events that fill the cache but are not counted [default: the stream's own "
                   "warm-up (streams built with --prefill-init), else 0].")
@click.option("--advice", "advice_path", type=click.Path(dir_okay=False), default=None,
              help="Advice .npz for predicted-next-use (from `expertcache nextuse eval --advice-out`).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run (JSON Lines).")
@click.option("--per-layer", "show_layers", is_flag=True, help="Also print the per-layer table.")
@click.option("--jobs", "-j", type=int, default=1, show_default=True,
              help="Worker processes for independent runs (0 = all local cores); results are identical.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write the miss-ratio curves to this .png/.pdf/.svg (needs matplotlib).")
@_guard
def replay_cmd(stream_dir: str, policies: list[str], rhos: list[float], scope: str, semantics: list[str],
               tie_break: str, seed: int, calibration: str | None, lfu_in_cache_counters: bool,
               lrfu_lambda: float, warmup_events: int | None, advice_path: str | None, as_json: bool, show_layers: bool, jobs: int, plot_path: str | None) -> None:
    """Replay STREAM_DIR for every (policy, semantics, rho) and report transfers (§2.4)."""
    from .events import read_events
    from .replay import ReplayConfig

    configs = [ReplayConfig(policy=p, rho=r, scope=scope, semantics=s, tie_break=tie_break, seed=seed,
                            lfu_in_cache_counters=lfu_in_cache_counters, lrfu_lambda=lrfu_lambda,
                            warmup_events=warmup_events or 0)
               for p in policies for s in semantics for r in rhos]   # validates before any work
    if jobs < 0:
        _fail(f"--jobs must be >= 0; got {jobs}")
    if plot_path and not plot_path.lower().endswith((".png", ".pdf", ".svg")):
        _fail(f"{plot_path}: --plot file must end in .png, .pdf or .svg")
    from .replay import default_jobs, sweep

    stream = read_events(stream_dir)
    if warmup_events is None and stream.provenance.get("warmup_events"):
        configs = [replace(c, warmup_events=int(stream.provenance["warmup_events"])) for c in configs]
    calib = read_events(calibration) if calibration else None
    advice = None
    if advice_path:
        from .nextuse import load_advice

        advice = load_advice(advice_path)
    with _progress() as bar:
        task = bar.add_task("replay", total=None)
        results = sweep(stream, configs, calib, jobs=jobs or default_jobs(), advice=advice,
                        progress=lambda done, total: bar.update(task, completed=done, total=total))
    if plot_path:
        from .plot import plot_miss_ratio_curves

        plot_miss_ratio_curves(results, plot_path)
    if as_json:
        for res in results:
            click.echo(json.dumps(res.to_dict(), sort_keys=True))
        return
    _print_results(results, show_layers)
    if plot_path:
        click.echo(f"wrote {plot_path}")


def _print_results(results: list, show_layers: bool) -> None:
    from rich.table import Table

    console = _console()
    if results:
        r = results[0]
        console.print(f"scope {r.scope}, tie-break {r.tie_break} (seed {r.seed}); {r.n_events} events, "
                      f"logical {r.logical}, union {r.union}, union/logical {r.union_over_logical:.4f} "
                      "(deduplication: the scheduler's, never a policy's)"
                      + (f"; after {r.warmup_events} warm-up events (replayed, not counted)" if r.warmup_events
                         else ""))
    table = Table(title="effective miss fraction m = transferred / logical (§2.4)")
    for col in ("policy", "semantics", "rho", "capacity", "transferred", "initial", "hits", "misses", "m"):
        text = col in ("policy", "semantics")
        table.add_column(col, justify="left" if text else "right", no_wrap=True)
    for r in results:
        table.add_row(r.policy, r.semantics, f"{r.rho:g}" if r.rho is not None else "-", str(r.capacity_total),
                      str(r.transferred), str(r.initial_load), str(r.hits), str(r.demand_misses),
                      f"{r.miss_fraction:.2%}")
    console.print(table)
    if show_layers:
        for r in results:
            lt = Table(title=f"{r.policy} / {r.semantics} / rho={r.rho}")
            for col in ("layer", "capacity", "hits", "misses", "initial", "union"):
                lt.add_column(col, justify="right")
            for x in r.per_layer:
                lt.add_row(str(x.layer), str(x.capacity), str(x.hits), str(x.demand_misses), str(x.initial_load),
                           str(x.union))
            console.print(lt)


# ------------------------------------------------------------------------------ demo
@main.command("demo")
@click.option("--batch", "-B", type=int, default=8, show_default=True, help="Concurrency B.")
@click.option("--rho", type=float, default=0.4, show_default=True, help="Residency fraction.")
@click.option("--seed", type=int, default=0, show_default=True, help="Tie and random-order seed.")
@click.option("--example", type=click.Choice(["model", "synthetic"]), default="model", show_default=True,
              help="model: routing recorded from the project's own small Qwen3-MoE; synthetic: expertcache.synth.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as one JSON object.")
@_guard
def demo(batch: int, rho: float, seed: int, example: str, as_json: bool) -> None:
    """Replay the bundled example under sequential and event-atomic semantics (Table 2 shape)."""
    from .demo import DEMO_SEMANTICS, run_demo
    from .replay import ReplayConfig

    if batch < 1:
        _fail(f"--batch must be a positive integer; got {batch}")
    ReplayConfig(rho=rho, seed=seed)  # validate
    with _progress() as bar:
        task = bar.add_task("demo replays", total=None)

        def tick(total: int) -> None:
            bar.update(task, total=total, advance=1)

        report = run_demo(batch=batch, rho=rho, seed=seed, progress=tick, example=example)
    if as_json:
        click.echo(json.dumps(report.to_dict(), sort_keys=True))
        return
    from rich.table import Table

    console = _console()
    console.print(f"[bold yellow]Data[/]: {report.caption}.")
    s = report.stream
    console.print(f"Evaluation stream: {s.n_events} events, union {s.union}, logical {s.logical}, "
                  f"union/logical {s.union / s.logical:.3f}; B={batch}, rho={rho}, per-layer scope, "
                  f"tie-break random (seed {seed}); static pin list fitted on a disjoint calibration half.")
    console.print(f"Regime: mean event ratio r = |E|/c_l = {report.mean_ratio:.3f}, "
                  f"{report.frac_over:.1%} of events exceed the layer quota (§6.1).")
    table = Table(title="Effective miss fraction M/logical under each replay semantics (Table 2 shape)")
    table.add_column("policy", no_wrap=True)
    for sem in DEMO_SEMANTICS:
        table.add_column(sem.replace("-", "\n", 1), justify="right")
    table.add_column("inflation\nascending", justify="right")
    table.add_column("inflation\nrandom", justify="right")
    for row in report.rows:
        table.add_row(row.policy, *[f"{row.miss(sem):.2%}" for sem in DEMO_SEMANTICS],
                      f"{row.inflation('sequential-ascending'):+.1%}", f"{row.inflation('sequential-random'):+.1%}")
    console.print(table)
    console.print("Inflation = sequential / event-atomic - 1. Event-atomic (Definition 2) is the fused-event "
                  "contract; sequential replay counts artificial refetches of experts evicted mid-event.")


# ---------------------------------------------------------------------------- report
@main.command("report")
@click.argument("source", type=click.Path(), required=False)
@click.option("--example", is_flag=True, help="Report on the bundled (synthetic) example trace.")
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False), help="Report directory to create.")
@click.option("--rho", type=float, default=0.4, show_default=True, help="Residency fraction.")
@click.option("--scope", type=click.Choice(["per-layer", "global"]), default="per-layer", show_default=True)
@click.option("--batch", "-B", type=int, default=8, show_default=True, help="Concurrency when SOURCE is a trace.")
@click.option("--offsets", default="zero", show_default=True, help="Arrival offsets when SOURCE is a trace.")
@click.option("--seeds", default="0,1,2,3,4", show_default=True, callback=_csv(int, "integers"),
              help="Tie seeds for the gap (spread = implementation stability).")
@click.option("--batches", default="1,2,4,8,16", show_default=True, callback=_csv(int, "integers"),
              help="B sweep (traces only).")
@click.option("--rhos", default="0.2,0.3,0.4", show_default=True, callback=_csv(float, "numbers"),
              help="rho sweep.")
@click.option("--permutations", type=int, default=5, show_default=True, help="Step permutations (§6.5).")
@click.option("--block-bytes", type=float, default=None,
              help="Bytes per expert block (default: the input manifest's expert_block_bytes if declared).")
@click.option("--block-bytes-preset", type=click.Choice(["frontier-reference"]), default=None,
              help="Use the §3.2 reference frame's 16.74 MiB blocks; figures are labelled projections.")
@click.option("--target-tokens-per-s", type=float, default=None, help="Target service rate (tokens/s).")
@click.option("--bandwidth", type=float, default=None, help="Host-to-device bandwidth budget (bytes/s).")
@click.option("--nextuse-model", type=click.Path(dir_okay=False), default=None,
              help="A next-use model fitted on a disjoint stream: adds the Tables 15-16 section.")
@click.option("--labels", type=click.Path(dir_okay=False), default=None,
              help="Request categories for the workload diagnostics (CSV 'request_id,category' or JSON Lines; "
                   "default: the trace's own, else one category).")
@click.option("--prompts", type=click.Path(), default=None,
              help="The prompts (JSON Lines or a probe-set directory) for the prompt-side fields (B1).")
@click.option("--jobs", "-j", type=int, default=1, show_default=True, help="Worker processes (0 = all cores).")
@click.option("--no-figures", is_flag=True, help="Skip the figures (no matplotlib needed).")
@click.option("--overwrite", is_flag=True, help="Replace an existing output directory.")
@_guard
def report_cmd(source: str | None, example: bool, out: str, rho: float, scope: str, batch: int, offsets: str,
               seeds: list[int], batches: list[int], rhos: list[float], permutations: int,
               block_bytes: float | None, block_bytes_preset: str | None, target_tokens_per_s: float | None,
               bandwidth: float | None, nextuse_model: str | None, labels: str | None, prompts: str | None,
               jobs: int, no_figures: bool, overwrite: bool) -> None:
    """Measure SOURCE (a trace or stream directory) and write the reporting block, tables and figures."""
    from importlib import resources

    from .replay import default_jobs
    from .report import ReportConfig, build_report, write_report

    if bool(source) == example:
        _fail("give either SOURCE (a trace or stream directory) or --example")
    _require_new(out, overwrite)
    cfg = ReportConfig(rho=rho, scope=scope, batch=batch, offsets=offsets, seeds=tuple(seeds),
                       batches=tuple(batches), rhos=tuple(rhos), n_permutations=permutations,
                       block_bytes=block_bytes, block_bytes_preset=block_bytes_preset,
                       target_tokens_per_s=target_tokens_per_s,
                       bandwidth_budget=bandwidth, nextuse_model=nextuse_model, labels=labels, prompts=prompts,
                       jobs=jobs or default_jobs())
    # the complete, canonical command (defaults spelled out), so the report can be regenerated exactly
    command = " ".join([
        "expertcache report", "--example" if example else source, "-o", out, "--rho", f"{rho:g}", "--scope", scope,
        "--batch", str(batch), "--offsets", offsets, "--seeds", ",".join(map(str, seeds)),
        "--batches", ",".join(map(str, batches)), "--rhos", ",".join(f"{r:g}" for r in rhos),
        "--permutations", str(permutations),
        *(["--block-bytes", f"{block_bytes:g}"] if block_bytes else []),
        *(["--block-bytes-preset", block_bytes_preset] if block_bytes_preset else []),
        *(["--target-tokens-per-s", f"{target_tokens_per_s:g}"] if target_tokens_per_s else []),
        *(["--bandwidth", f"{bandwidth:g}"] if bandwidth else []),
        *(["--nextuse-model", nextuse_model] if nextuse_model else []),
        *(["--labels", labels] if labels else []),
        *(["--prompts", prompts] if prompts else []),
    ])
    with _progress() as bar:
        bar.add_task("measuring", total=None)
        if example:
            with resources.as_file(resources.files("expertcache") / "data" / "example_trace") as path:
                rep = build_report(path, cfg, command)
        else:
            rep = build_report(source, cfg, command)
        write_report(rep, out, overwrite=overwrite, figures=not no_figures)
    click.echo(rep.block, nl=False)
    skipped = rep.data.get("figures")
    click.echo(f"wrote {out}/report.md, report.json, block.txt"
               + ("" if no_figures or skipped else " and figures/") + (f"; figures {skipped}" if skipped else ""))


@main.command("align")
@click.argument("traces", nargs=-1, required=True)
@click.option("--batches", default="1,2,4,8,16", show_default=True, callback=_csv(int, "integers"),
              help="Concurrencies to measure for every model.")
@click.option("--batch", "-B", type=int, default=8, show_default=True, help="The conventional batch alignment.")
@click.option("--rho", type=float, default=0.4, show_default=True, help="Residency fraction.")
@click.option("--targets", default=None, callback=_csv(float, "numbers"),
              help="r̄ targets (default: every measured r̄).")
@click.option("--tolerance", type=float, default=0.15, show_default=True, help="Relative r̄ tolerance.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per row.")
@_guard
def align_cmd(traces: tuple[str, ...], batches: list[int], batch: int, rho: float, targets: list[float] | None,
              tolerance: float, as_json: bool) -> None:
    """Compare models aligned on batch size and on mean r (Table 11 shape). TRACES: [NAME=]TRACE_DIR ..."""
    from .analysis import align, reference_frame_r_null, regime_grid
    from .replay import ReplayConfig
    from .trace import read_trace

    ReplayConfig(rho=rho)
    named = {}
    for item in traces:
        name, _, path = item.rpartition("=")
        named[name or path] = read_trace(path)
    if len(named) < 2:
        _fail("give at least two traces to align ([NAME=]TRACE_DIR ...)")
    grid = regime_grid(named, batches, rho)
    rows = align(grid, batch, targets, tolerance)
    if as_json:
        for r in rows:
            click.echo(json.dumps(r.to_dict(), sort_keys=True))
        return
    from rich.table import Table

    table = Table(title=f"Recoverable gap under two alignments (rho = {rho:g}, per-layer, event-atomic)")
    for col in ("alignment", "model", "B", "mean r", "gap", "spread"):
        table.add_column(col, justify="left" if col in ("alignment", "model") else "right", no_wrap=True)
    for r in rows:
        label = "on batch size" if r.alignment == "batch size" else f"on r ~= {r.target:.3f}"
        table.add_row(label, r.model, str(r.batch), f"{r.r_mean:.3f}", "-" if r.gap is None else f"{r.gap:.2%}",
                      "" if r.spread_pp is None else f"{r.spread_pp:.1f} pp")
    console = _console()
    console.print(table)
    console.print(f"Analytical projection (not a measurement): the §3.2 reference frame at B = {batch} has "
                  f"r ~= {reference_frame_r_null(batch, rho):.3f} under the uniform routing null.")


# --------------------------------------------------------------------------- nextuse
@main.group()
def nextuse() -> None:
    """Next-use prediction (§7.3): fit on one stream, evaluate on a disjoint one."""


@nextuse.command("fit")
@click.argument("stream_dir", type=click.Path())
@click.option("--model", "kind", type=click.Choice(["linear", "gbt"]), default="linear", show_default=True,
              help="linear (the paper's) or gbt (gradient-boosted trees; needs scikit-learn).")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False),
              help="Model file: .json for linear, .npz for gbt.")
@click.option("--max-rows", type=int, default=200_000, show_default=True, help="Rows sampled for fitting.")
@click.option("--seed", type=int, default=0, show_default=True)
@_guard
def nextuse_fit(stream_dir: str, kind: str, out: str, max_rows: int, seed: int) -> None:
    """Fit a next-use-distance predictor on STREAM_DIR's access features."""
    from .events import read_events
    from .nextuse import GradientBoostedNextUse, LinearNextUse, access_features, transfer_r2

    want = ".json" if kind == "linear" else ".npz"
    if not out.endswith(want):
        _fail(f"{out}: a {kind} model is written as {want}")
    f = access_features(read_events(stream_dir))
    model = (LinearNextUse.fit(f, max_rows, seed) if kind == "linear"
             else GradientBoostedNextUse.fit(f, max_rows=max_rows, seed=seed))
    model.save(out)
    click.echo(f"wrote {out}: {kind} model, in-sample R2 {transfer_r2(model, f):.3f}")


@nextuse.command("eval")
@click.argument("model_path", type=click.Path(dir_okay=False))
@click.argument("stream_dir", type=click.Path())
@click.option("--rho", type=float, default=0.4, show_default=True)
@click.option("--scope", type=click.Choice(["per-layer", "global"]), default="per-layer", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Tie seed.")
@click.option("--advice-out", type=click.Path(dir_okay=False), default=None, help="Also write the advice .npz.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_guard
def nextuse_eval(model_path: str, stream_dir: str, rho: float, scope: str, seed: int, advice_out: str | None,
                 as_json: bool) -> None:
    """Transfer R2 on STREAM_DIR and the predicted-next-use policy against the baselines (Table 15 shape)."""
    from .analysis.gap import CAUSAL_POLICIES
    from .events import read_events
    from .nextuse import (
        access_features,
        advice_from_predictions,
        load_predictor,
        save_advice,
        transfer_r2,
    )
    from .replay import ReplayConfig, replay

    model = load_predictor(model_path)
    stream = read_events(stream_dir)
    f = access_features(stream)
    advice = advice_from_predictions(f, model.predict(f.X), {"model": model_path})
    miss = {p: replay(stream, ReplayConfig(p, rho=rho, scope=scope, seed=seed)).miss_fraction
            for p in (*CAUSAL_POLICIES, "belady")}
    miss["predicted-next-use"] = replay(stream, ReplayConfig("predicted-next-use", rho=rho, scope=scope, seed=seed),
                                        advice=advice).miss_fraction
    best = min(CAUSAL_POLICIES, key=lambda p: (miss[p], p))
    gap = miss[best] - miss["belady"]
    out = {"transfer_r2": transfer_r2(model, f), "miss_fraction": miss, "best_causal": best,
           "fraction_of_gap_recovered": (miss[best] - miss["predicted-next-use"]) / gap if gap > 0 else None}
    if advice_out:
        from .storage import atomic_file

        with atomic_file(advice_out) as tmp:
            save_advice(advice, tmp)
    if as_json:
        click.echo(json.dumps(out, sort_keys=True))
        return
    click.echo(f"transfer R2 on log next-use distance: {out['transfer_r2']:.3f}")
    for p, m in miss.items():
        click.echo(f"  {p:20s} {m:.2%}" + ("  (best causal)" if p == best else ""))
    rec = out["fraction_of_gap_recovered"]
    click.echo(f"fraction of the gap recovered: {'n/a' if rec is None else f'{rec:+.2%}'}")


@nextuse.command("victims")
@click.argument("model_path", type=click.Path(dir_okay=False))
@click.argument("stream_dir", type=click.Path())
@click.option("--rho", type=float, default=0.4, show_default=True)
@click.option("--scope", type=click.Choice(["per-layer", "global"]), default="per-layer", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Tie and bootstrap seed.")
@click.option("--every", type=int, default=37, show_default=True, help="Sample every n-th eviction decision.")
@click.option("--bootstrap", "n_boot", type=int, default=1000, show_default=True, help="Bootstrap resamples.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_guard
def nextuse_victims(model_path: str, stream_dir: str, rho: float, scope: str, seed: int, every: int, n_boot: int,
                    as_json: bool) -> None:
    """Victim-ranking quality at sampled eviction decisions, tie-aware (Table 16 shape)."""
    from .events import read_events
    from .nextuse import access_features, advice_from_predictions, load_predictor
    from .nextuse.victims import record_decisions, score_decisions
    from .replay import ReplayConfig

    ReplayConfig(rho=rho)
    if every < 1 or n_boot < 1:
        _fail("--every and --bootstrap must be >= 1")
    model = load_predictor(model_path)
    stream = read_events(stream_dir)
    f = access_features(stream)
    advice = advice_from_predictions(f, model.predict(f.X), {"model": model_path})
    rep = score_decisions(record_decisions(stream, advice, rho, scope, seed, every), n_boot, seed)
    if as_json:
        click.echo(json.dumps(rep.to_dict(), sort_keys=True))
        return
    click.echo(f"{rep.n_decisions} sampled decisions (every {every}th); mean candidate set {rep.mean_candidates:.1f}, "
               f"mean optimal-victim set {rep.mean_optimal_set:.2f}; 95% CIs by cluster bootstrap over steps")
    click.echo(f"{'victim chosen by':22s} {'in optimal set':>28s} {'distance regret':>16s}")
    for k, (m, lo, hi) in rep.in_optimal_set.items():
        click.echo(f"{k:22s} {m:9.2%} [{lo:7.2%}, {hi:7.2%}] {rep.distance_regret[k][0]:16.5f}")
    for label, (m, lo, hi) in (("all candidates", rep.spearman_all),
                               ("excluding never-again", rep.spearman_excluding_never)):
        click.echo(f"Spearman predicted vs true next use, {label}: {m:+.3f} [{lo:+.3f}, {hi:+.3f}]")


# -------------------------------------------------------------------------- rotation
@main.command("affinity")
@click.argument("trace_dir", type=click.Path())
@click.option("--admitted", "-A", type=int, default=24, show_default=True, help="Admitted sessions.")
@click.option("--batch", "-B", type=int, default=8, show_default=True, help="Sessions served per step.")
@click.option("--window", "-W", type=int, default=4, show_default=True, help="Max steps between services.")
@click.option("--rho", type=float, default=0.4, show_default=True)
@click.option("--policies", default="lfru,static-same-trace", show_default=True, callback=_csv(str, "policies"))
@click.option("--calibration", type=click.Path(), default=None, help="Calibration stream for 'static'.")
@click.option("--best-of", "n_draws", type=int, default=300, show_default=True,
              help="Draws for the per-step best-of-N estimate (§8.4), 0 to skip.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_guard
def affinity_cmd(trace_dir: str, admitted: int, batch: int, window: int, rho: float, policies: list[str],
                 calibration: str | None, n_draws: int, as_json: bool) -> None:
    """Affinity batching under deadline rotation on complete trajectories (Table 18 shape, §8.3-§8.4)."""
    from .events import read_events
    from .experiments import scope_block
    from .replay import ReplayConfig
    from .rotation import RotationConfig, affinity_experiment, best_of_n_estimate
    from .trace import read_trace

    cfg = RotationConfig(admitted, batch, window)
    for p in policies:
        ReplayConfig(p, rho=rho)
    trace = read_trace(trace_dir)
    calib = read_events(calibration) if calibration else None
    rows, stats = affinity_experiment(trace, cfg, rho, tuple(policies), calibration=calib)
    bound = best_of_n_estimate(trace, cfg, n_draws) if n_draws > 0 else None
    scope = scope_block(trace, rho, batch, f"rotation, {admitted} admitted, {batch} served",
                        f"W = {window} (max inter-service interval)")
    scope["replay"] = "event-atomic, full trajectories"
    if _scoped(scope, as_json, {"rows": [r.to_dict() for r in rows],
                                "stats": {k: v.to_dict() for k, v in stats.items()}, "best_of_n_upper_bound": bound}):
        return
    click.echo(f"{'policy':18s} {'FCFS':>8s} {'causal':>8s} {'oracle':>8s} {'causal gain':>12s} {'oracle gain':>12s}"
               f" {'share':>8s} {'dp99':>8s}")
    for r in rows:
        share = "n/a" if r.share is None else f"{r.share:.1%}"
        click.echo(f"{r.policy:18s} {r.fcfs:8.2%} {r.causal:8.2%} {r.oracle:8.2%} {r.causal_gain:12.2%} "
                   f"{r.oracle_gain:12.2%} {share:>8s} {r.delta_p99_causal:+8.2%}")
    for name, st in stats.items():
        click.echo(f"  {name:22s} mean batch {st.mean_batch:.2f}, max interval {st.max_interval}, "
                   f"violations {st.deadline_violations}, p99 latency {st.p99_latency_steps:.1f} steps")
    if bound is not None:
        click.echo(f"per-step best-of-{n_draws} union reduction: {bound:.2%} -- an UPPER BOUND from single-step "
                   "order statistics (§8.4), not an achievable gain; compare the trajectory gains above")


def _scoped(scope: dict, as_json: bool, payload: dict) -> bool:
    """Print ``{"scope": ..., **payload}`` as JSON (True: done) or the D4 scope line before a table (False)."""
    if as_json:
        click.echo(json.dumps({"scope": scope, **payload}, sort_keys=True))
        return True
    click.echo("scope: " + "; ".join(f"{k} {v}" for k, v in scope.items()))
    return False


@main.group()
def experiment() -> None:
    """Scoped experiments (§9): each prints its scope block (model, rho, concurrency, discipline, fairness)."""


def _split_trace(trace_dir: str, calibration: str | None):
    """The evaluated trace and its calibration: a separate trace, or the even/odd requests of one."""
    import numpy as np

    from .trace import read_trace, select_requests

    trace = read_trace(trace_dir)
    if calibration:
        return trace, read_trace(calibration), "calibration trace " + calibration
    idx = np.arange(trace.n_requests)
    return (select_requests(trace, idx[1::2], "odd requests"), select_requests(trace, idx[0::2], "even requests"),
            "even requests of the same trace (disjoint from the evaluated odd ones)")


@experiment.command("static-vs-dynamic")
@click.argument("trace_dir", type=click.Path())
@click.option("--calibration", type=click.Path(), default=None,
              help="Calibration trace for the pin list (default: even requests; odd ones are evaluated).")
@click.option("--batches", default="2,4,8,16", show_default=True, callback=_csv(int, "integers"))
@click.option("--rho", type=float, default=0.4, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@_guard
def experiment_static(trace_dir: str, calibration: str | None, batches: list[int], rho: float,
                      as_json: bool) -> None:
    """Static pinned (calibration-frozen) vs LFRU and Belady across concurrency (Table 19 shape)."""
    from .experiments import static_vs_dynamic
    from .replay import ReplayConfig

    ReplayConfig(rho=rho)
    trace, calib, fit = _split_trace(trace_dir, calibration)
    rows, scope = static_vs_dynamic(trace, calib, batches, rho)
    scope["static_fit_source"] = fit
    if _scoped(scope, as_json, {"rows": [r.to_dict() for r in rows]}):
        return
    click.echo(f"{'B':>4s} {'static':>9s} {'LFRU':>9s} {'Belady':>9s} {'static vs LFRU':>15s}")
    for r in rows:
        click.echo(f"{r.batch:4d} {r.static:9.2%} {r.lfru:9.2%} {r.belady:9.2%} {r.static_vs_lfru:+15.1%}")


@experiment.command("disciplines")
@click.argument("trace_dir", type=click.Path())
@click.option("--calibration", type=click.Path(), default=None,
              help="Calibration trace for the pin list (default: even requests; odd ones are evaluated).")
@click.option("--batch", "-B", type=int, default=8, show_default=True)
@click.option("--admitted", "-A", type=int, default=24, show_default=True)
@click.option("--window", "-W", type=int, default=4, show_default=True)
@click.option("--rho", type=float, default=0.4, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@_guard
def experiment_disciplines(trace_dir: str, calibration: str | None, batch: int, admitted: int, window: int,
                           rho: float, as_json: bool) -> None:
    """The same requests under continuous batching and deadline rotation (Table 20 shape, §9.3)."""
    from .experiments import service_disciplines
    from .replay import ReplayConfig

    ReplayConfig(rho=rho)
    trace, calib, fit = _split_trace(trace_dir, calibration)
    rows, scope = service_disciplines(trace, calib, batch, admitted, window, rho)
    scope["static_fit_source"] = fit
    if _scoped(scope, as_json, {"rows": [r.to_dict() for r in rows]}):
        return
    click.echo(f"{'service discipline':32s} {'mean batch':>10s} {'static':>9s} {'LFRU':>9s} {'static vs LFRU':>15s}")
    for r in rows:
        click.echo(f"{r.discipline:32s} {r.mean_batch:10.2f} {r.static:9.2%} {r.lfru:9.2%} {r.static_vs_lfru:+15.1%}")


@experiment.command("prefill-order")
@click.argument("trace_dir", type=click.Path())
@click.option("--chunk", type=int, default=16, show_default=True, help="Prefill chunk size in tokens.")
@click.option("--rho", type=float, default=0.4, show_default=True)
@click.option("--policies", default="lru,belady", show_default=True, callback=_csv(str, "policies"))
@click.option("--json", "as_json", is_flag=True)
@_guard
def experiment_prefill(trace_dir: str, chunk: int, rho: float, policies: list[str], as_json: bool) -> None:
    """Layer-major vs chunk-major prefill: total expert traffic on the same trace and cache (§8.5)."""
    import numpy as np

    from .experiments import scope_block
    from .prefill import ORDERS, prefill_events, uniform_prefill_estimate
    from .replay import ReplayConfig, replay
    from .trace import PREFILL, read_trace

    for p in policies:
        ReplayConfig(p, rho=rho)
    trace = read_trace(trace_dir)
    streams = {o: prefill_events(trace, chunk, o) for o in ORDERS}
    rows = [{"order": o, "scope": sc, "policy": p, "transferred": replay(s, ReplayConfig(p, rho=rho, scope=sc)).transferred,
             "logical": s.logical}
            for o, s in streams.items() for sc in ("per-layer", "global") for p in policies]
    lengths = np.bincount(trace.request[trace.phase == PREFILL], minlength=trace.n_requests)
    est = uniform_prefill_estimate(trace.n_layers, trace.n_experts, trace.top_k, int(lengths[lengths > 0].mean()),
                                   chunk, rho)
    scope = scope_block(trace, rho, "one request at a time", f"sequential prefill, chunks of {chunk} tokens",
                        "n/a")
    if _scoped(scope, as_json, {"rows": rows, "uniform_estimate_per_prompt": est}):
        return
    click.echo(f"{'order':12s} {'scope':10s} {'policy':8s} {'transferred':>12s} {'logical':>10s}")
    for r in rows:
        click.echo(f"{r['order']:12s} {r['scope']:10s} {r['policy']:8s} {r['transferred']:12d} {r['logical']:10d}")
    click.echo(f"uniform-routing estimate per prompt (analytical, global pool): layer-major "
               f"{est['layer_major']:.0f}, chunk-major {est['chunk_major']:.0f} blocks "
               f"(x{est['ratio_chunk_over_layer']:.1f})")


@experiment.command("prefill-gap")
@click.argument("trace_dir", type=click.Path())
@click.option("--chunk", type=int, default=128, show_default=True, help="Prefill block size in tokens.")
@click.option("--rhos", default="0.2,0.3,0.4", show_default=True, callback=_csv(float, "numbers"))
@click.option("--seeds", default="0,1,2,3,4", show_default=True, callback=_csv(int, "integers"))
@click.option("--order", type=click.Choice(["chunk-major", "layer-major"]), default="chunk-major", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@_guard
def experiment_prefill_gap(trace_dir: str, chunk: int, rhos: list[float], seeds: list[int], order: str,
                           as_json: bool) -> None:
    """Steady-state prefill eviction/admission gap (§4.4 Table 3, §8.1): best causal vs Belady on prefill events."""
    from .analysis import gap_decomposition
    from .experiments import scope_block
    from .prefill import prefill_events
    from .replay import ReplayConfig
    from .trace import read_trace

    for r in rhos:
        ReplayConfig(rho=r)
    trace = read_trace(trace_dir)
    stream = prefill_events(trace, chunk, order)
    rows = [gap_decomposition(stream, r, seeds=tuple(seeds)).to_dict() for r in rhos]
    scope = scope_block(trace, rhos, "one request at a time", f"prefill, {chunk}-token blocks, {order}", "n/a")
    if _scoped(scope, as_json, {"rows": rows}):
        return
    click.echo(f"{'rho':>5s} {'best causal':>12s} {'miss':>8s} {'belady':>8s} {'gap':>8s} {'tie-seed spread':>16s}")
    for r in rows:
        gap = "n/a" if r["gap"] is None else f"{r['gap']:.3%}"
        spread = "n/a" if r["gap_spread"] is None else f"{r['gap_spread']:.2e}"
        click.echo(f"{r['rho']:5.2f} {r['best_causal']:>12s} {r['miss_fraction'][r['best_causal']]:8.2%} "
                   f"{r['miss_fraction']['belady']:8.2%} {gap:>8s} {spread:>16s}")


@experiment.command("transition")
@click.argument("trace_dir", type=click.Path())
@click.option("--labels", type=click.Path(dir_okay=False), default=None,
              help="Request categories: CSV 'request_id,category' or JSON Lines [default: the trace's own].")
@click.option("--windows", default=None, callback=_csv(int, "integers"),
              help="Post-transition windows N (requests of the target category) [default: the paper's "
                   "10,25,50,100 that the smallest category can fill].")
@click.option("--warm", type=int, default=None, help="Requests of the source category that warm the cache "
              "[default: the largest window].")
@click.option("--rhos", default="0.2,0.3,0.4", show_default=True, callback=_csv(float, "numbers"))
@click.option("--seeds", default="0,1,2", show_default=True, callback=_csv(int, "integers"),
              help="Request-order seeds.")
@click.option("--batch", "-B", type=int, default=8, show_default=True)
@click.option("--threshold", type=float, default=0.10, show_default=True, help="Criterion: gap >= threshold.")
@click.option("--json", "as_json", is_flag=True)
@_guard
def experiment_transition(trace_dir: str, labels: str | None, windows: list[int], warm: int | None,
                          rhos: list[float], seeds: list[int], batch: int, threshold: float, as_json: bool) -> None:
    """Warm-cache workload transition A -> B over windows of N requests (§8.1): gap after a warm start."""
    from .experiments import warm_transition
    from .replay import ReplayConfig
    from .trace import read_trace

    for r in rhos:
        ReplayConfig(rho=r)
    if batch < 1:
        _fail(f"--batch must be a positive integer; got {batch}")
    trace = read_trace(trace_dir)
    units, scope = warm_transition(trace, labels, windows, rhos, seeds, batch, warm, threshold=threshold)
    if _scoped(scope, as_json, {"units": [u.to_dict() for u in units]}):
        return
    click.echo(f"{'A -> B':28s} {'N':>4s} {'rho':>5s} {'seed':>4s} {'best causal':>12s} {'m':>8s} {'belady':>8s} "
               f"{'gap':>8s} {'cold m':>8s}")
    for u in units:
        click.echo(f"{(u.source + ' -> ' + u.target)[:28]:28s} {u.window:4d} {u.rho:5.2f} {u.seed:4d} "
                   f"{u.best_causal:>12s} {u.miss_fraction[u.best_causal]:8.2%} {u.miss_fraction['belady']:8.2%} "
                   f"{u.gap:8.2%} {u.cold:8.2%}")
    click.echo(f"{scope['units_meeting']}/{len(units)} units meet {scope['criterion']}")


@experiment.command("partition")
@click.argument("trace_dir", type=click.Path())
@click.option("--labels", type=click.Path(dir_okay=False), default=None,
              help="Request categories: CSV 'request_id,category' or JSON Lines [default: the trace's own].")
@click.option("--groups", default=None,
              help="Partitions separated by ';', categories by ',', e.g. 'math;code;*' ('*' = every other) "
                   "[default: one partition per category].")
@click.option("--slots", default=None, callback=_csv(int, "integers"),
              help="Per-layer slots of every partition but the last, which takes the rest of the quota "
                   "[default: an even split].")
@click.option("--rho", type=float, default=0.4, show_default=True)
@click.option("--batch", "-B", type=int, default=8, show_default=True)
@click.option("--policy", default="lfru", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Tie seed.")
@click.option("--json", "as_json", is_flag=True)
@_guard
def experiment_partition(trace_dir: str, labels: str | None, groups: str | None, slots: list[int] | None,
                         rho: float, batch: int,
                         policy: str, seed: int, as_json: bool) -> None:
    """Semantic category partitioning at equal total capacity vs one shared cache (§8.2), with the D5 guard."""
    from .experiments import category_partition
    from .replay import ReplayConfig
    from .trace import read_trace

    ReplayConfig(policy=policy, rho=rho)
    if batch < 1:
        _fail(f"--batch must be a positive integer; got {batch}")
    parts = [[c.strip() for c in g.split(",") if c.strip()] for g in groups.split(";")] if groups else None
    if parts is not None and any(not p for p in parts):
        _fail(f"--groups has an empty partition: {groups!r}; expected e.g. 'math;code;*'")
    res, scope = category_partition(read_trace(trace_dir), labels, parts, slots, rho, batch, policy, seed)
    if _scoped(scope, as_json, {"result": res.to_dict()}):
        return
    for g, sl, sh, u in zip(res.partitions, res.slots, res.logical_share, res.per_step_union, strict=True):
        click.echo(f"  partition {','.join(g)[:40]:40s} slots/layer {sl:4d}  logical share {sh:6.1%}  "
                   f"mean per-step union {u:6.1f}")
    click.echo(f"shared cache m {res.shared:.2%}; partitioned m {res.measured:.2%} "
               f"(transfer change {res.transfer_change:+.1%}); fragmentation-only prediction {res.predicted:.2%}")
    if res.fragmentation_share is not None:
        click.echo(f"capacity fragmentation explains {res.fragmentation_share:.0%} of the degradation")
    for w in res.warnings:
        click.echo(f"WARNING: {w}")


# ----------------------------------------------------------------------- conformance
@main.command("conformance")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@_guard
def conformance(as_json: bool) -> None:
    """Replay the bundled conformance trace (§2.5) and compare with the hand-derived counts."""
    from dataclasses import replace

    from .conformance import CONFORMANCE_CONFIG, EXPECTED, conformance_stream
    from .replay import replay

    s = conformance_stream()
    out = {}
    ok = True
    for sem, (hits, misses) in EXPECTED.items():
        r = replay(s, replace(CONFORMANCE_CONFIG, semantics=sem))
        out[sem] = {"hits": r.hits, "misses": r.demand_misses, "expected_hits": hits, "expected_misses": misses}
        ok &= (r.hits, r.demand_misses) == (hits, misses)
    if as_json:
        click.echo(json.dumps({"ok": ok, "union": s.union, **out}, sort_keys=True))
    else:
        click.echo(f"conformance trace: 3 layers x 4 experts x 5 steps, {s.union} union accesses; "
                   "lru, rho=0.5 (c_l=2), tie-break id")
        for sem, v in out.items():
            click.echo(f"  {sem:22s} {v['hits']:3d} hits {v['misses']:3d} misses "
                       f"(expected {v['expected_hits']}/{v['expected_misses']})")
        click.echo("OK" if ok else "MISMATCH")
    if not ok:
        sys.exit(1)


# Command modules that live beside this one (each defines one click command or group named like the module's
# suffix). They import their heavy dependencies (torch, transformers, ray) lazily, inside the commands.
_PLUGINS = ("collect", "routers", "prefetch", "spec", "prereg", "probe", "audit", "execute")


def _register_plugins() -> None:
    import importlib
    import importlib.util

    for name in _PLUGINS:
        if importlib.util.find_spec(f"expertcache.cli_{name}") is not None:
            module = importlib.import_module(f"expertcache.cli_{name}")
            main.add_command(getattr(module, name))


if __name__ == "__main__":  # pragma: no cover
    # run the package's own module (plugins import it), not this __main__ copy
    from expertcache.cli import main as _main

    _main()
else:
    _register_plugins()
