"""``expertcache timing``: policy x time per output token, tokens/s, stall share and bytes per token."""

from __future__ import annotations

import click

from .main import (
    _console,
    _csv,
    _echo_json,
    _fail,
    _guard,
    _require_new,
    _stream_batch,
    main,
    read_calibration,
)


class _DefaultRun(click.Group):
    """``expertcache timing STREAM ...`` runs the ``run`` subcommand; other subcommands keep their names."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@main.group("timing", cls=_DefaultRun)
def timing() -> None:
    """Put replays on a device timeline: `expertcache timing STREAM --policy lru,lfu --profile P`.

    With prefetches: `expertcache timing STREAM --advice FILE --priority advice -R 6 --issue prev-layer`.
    Built-in profiles: pcie-gen4-x16, pcie-gen5-x16, nvlink-c2c (link figures stated, compute ASSUMED);
    or a profile JSON (docs/timing.md).
    """


@timing.command("run")
@click.argument("stream_dir", type=click.Path())
@click.option("--policy", "-p", "policies", default="lru,lfu,static-same-trace", show_default=True,
              callback=_csv(str, "policy names"), help="Comma list of replay policies.")
@click.option("--profile", "profile_name", default="pcie-gen4-x16", show_default=True,
              help="A built-in profile name or a profile JSON file.")
@click.option("--rho", type=float, default=0.4, show_default=True, help="Residency fraction.")
@click.option("--capacity", "-C", type=int, default=None,
              help="Slots per layer (per-layer scope) or in total (global); overrides --rho.")
@click.option("--scope", type=click.Choice(["per-layer", "global"]), default="per-layer", show_default=True)
@click.option("--contract", type=click.Choice(["fused", "serialized"]), default="fused", show_default=True,
              help="fused: event-atomic residency, misses stream while hits compute; serialized: one expert "
                   "at a time (sequential-ascending replay).")
@click.option("--tie-break", type=click.Choice(["random", "id"]), default="random", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of tie ranks.")
@click.option("--calibration", type=click.Path(), default=None,
              help="Stream directory the 'static' policy fits its pin list on.")
@click.option("--expert-bytes", type=int, default=None,
              help="Bytes per expert block [default: the profile's, else the stream's recorded size].")
@click.option("--warmup-events", type=int, default=None,
              help="Leading events that fill the cache but are not timed [default: the stream's own warm-up].")
@click.option("--advice", "advice_path", type=click.Path(dir_okay=False), default=None,
              help="Prefetch with this advice .npz (priority and/or prefetch_score aligned to STREAM_DIR's events, "
                   "as `prefetch replay --advice`): the proactive replay's loads go on the link too.")
@click.option("--priority", default=None,
              help="With prefetches: comma list of retention keys lru, lfu, lfru, lrfu, advice (as `prefetch "
                   "replay`) [default: lru]; replaces --policy.")
@click.option("--budget", "-R", default=None,
              help="With prefetches: comma list of candidate budgets R, one run each [default: 0].")
@click.option("--issue", default="prev-layer", show_default=True,
              help="When an event's prefetches are issued: prev-layer (the preceding layer's routing is known), "
                   "prev-layer:D (D layers before, a lookahead predictor), prev-token (the previous step ended).")
@click.option("--lrfu-lambda", type=float, default=0.5, show_default=True, help="LRFU decay (--priority lrfu).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per policy (JSON Lines).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Draw the timeline of a window of steps to this .png/.pdf/.svg (needs matplotlib).")
@click.option("--window", default="0:4", show_default=True, help="FIRST:COUNT counted steps for --plot.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --plot file.")
@_guard
def timing_run(stream_dir: str, policies: list[str], profile_name: str, rho: float, capacity: int | None,
               scope: str, contract: str, tie_break: str, seed: int, calibration: str | None,
               expert_bytes: int | None, warmup_events: int | None, advice_path: str | None, priority: str | None,
               budget: str | None, issue: str, lrfu_lambda: float, as_json: bool, plot_path: str | None,
               window: str, overwrite: bool) -> None:
    """Replay STREAM_DIR for each policy and time it under a hardware profile.

    With --advice, --priority or --budget the replay is the proactive one of `expertcache prefetch replay`
    (per-layer, fused contract): each event's prefetches are issued at --issue and share the link with the
    demand misses; the table adds the proactive loads P split into timely, late and useless.
    """
    from ..events import read_events
    from ..replay import ReplayConfig
    from ..timing import load_profile, simulate
    from ..timing.model import recorded_expert_bytes

    try:
        first, count = (int(x) for x in window.split(":"))
        if first < 0 or count < 1:
            raise ValueError
    except ValueError:
        _fail(f"--window must be FIRST:COUNT with FIRST >= 0 and COUNT >= 1; got {window!r}")
    if expert_bytes is not None and expert_bytes < 1:
        _fail(f"--expert-bytes must be >= 1; got {expert_bytes}")
    if plot_path:
        if not plot_path.lower().endswith((".png", ".pdf", ".svg")):
            _fail(f"{plot_path}: --plot file must end in .png, .pdf or .svg")
        _require_new(plot_path, overwrite, file=True)
    profile = load_profile(profile_name)
    stream = read_events(stream_dir)
    calib = read_calibration(calibration, _stream_batch(stream)) if calibration else None
    warm = int(stream.provenance.get("warmup_events", 0)) if warmup_events is None else warmup_events
    caps = None
    if capacity is not None:
        caps = (capacity,) * (stream.n_layers if scope == "per-layer" else 1)
    if expert_bytes is None and profile.expert_bytes is None and recorded_expert_bytes(stream) is None:
        _fail(f"{stream_dir}: the expert block size is unknown (the stream records none): pass --expert-bytes "
              "BYTES, or use a profile with expert_bytes")
    results = []
    proactive = advice_path is not None or priority is not None or budget is not None
    if proactive:
        results = _proactive_runs(stream, profile, policies, advice_path, priority, budget, issue, rho, caps,
                                  scope, contract, tie_break, seed, warm, lrfu_lambda, expert_bytes)
    for policy in policies if not proactive else ():
        cfg = ReplayConfig(policy, rho=rho, capacity=caps, scope=scope, tie_break=tie_break, seed=seed,
                           warmup_events=warm)
        results.append(simulate(stream, cfg, profile, contract=contract, calibration=calib,
                                expert_bytes=expert_bytes))
    if plot_path:
        from ..timing.figure import plot_timeline

        plot_timeline(results, plot_path, first, count)
    if as_json:
        from ..storage import stream_source

        for r in results:
            _echo_json({**r.to_dict(), **stream_source(stream_dir)})
        return
    from rich.table import Table

    head = results[0]
    table = Table(title=f"{stream_dir}: {head.n_steps} steps, {head.output_tokens} output tokens; profile "
                        f"{profile.name} ({contract}, {head.scope}, capacity {head.capacity_total} blocks, "
                        f"{head.expert_bytes:,} B per expert)")
    extra = ("R", "P", "timely", "late", "useless") if proactive else ()
    for col in ("priority" if proactive else "policy", *extra, "transfers", "hits", "TPOT mean ms", "TPOT p50 ms",
                "TPOT p99 ms", "tokens/s", "stall share", "link busy", "MB/token"):
        table.add_column(col, justify="left" if col in ("policy", "priority") else "right")
    for r in results:
        pf = (str(r.prefetch_budget), f"{r.prefetch_loads:,}", f"{r.prefetch_timely:,}", f"{r.prefetch_late:,}",
              f"{r.prefetch_useless:,}") if proactive else ()
        table.add_row(r.policy, *pf, f"{r.transferred:,}", f"{r.hits:,}", f"{r.tpot_mean_s * 1e3:.3f}",
                      f"{r.tpot_p50_s * 1e3:.3f}", f"{r.tpot_p99_s * 1e3:.3f}", f"{r.tokens_per_s:,.1f}",
                      f"{r.stall_share:.1%}", f"{r.link_busy_share:.1%}",
                      f"{(r.bytes_per_token or 0) / 1e6:.3f}")
    console = _console()
    console.print(table)
    if proactive:
        console.print(f"prefetches issued at {issue}; timely: landed before the expert was to compute; late: the "
                      "compute unit waited for it; useless: never hit before leaving the cache")
    console.print(f"profile source: {profile.source}")


def _proactive_runs(stream, profile, policies, advice_path, priority, budget, issue, rho, caps, scope, contract,
                    tie_break, seed, warm, lrfu_lambda, expert_bytes) -> list:
    """One :func:`expertcache.timing.prefetch.simulate_prefetch` per retention key x budget."""
    from ..replay.proactive import ProactiveConfig
    from ..timing.prefetch import issue_lead, simulate_prefetch

    ctx = click.get_current_context()
    if ctx.get_parameter_source("policies") is not click.core.ParameterSource.DEFAULT:
        _fail("with --advice/--priority/--budget the retention keys are --priority (lru, lfu, lfru, lrfu, advice), "
              "not --policy")
    if scope != "per-layer":
        _fail("prefetching replays a per-layer cache: drop --scope global")
    if contract != "fused":
        _fail("prefetching is timed under the fused contract (the proactive replay is event-atomic): drop "
              "--contract serialized")
    issue_lead(issue, stream.n_layers)
    keys = [p.strip() for p in (priority or "lru").split(",") if p.strip()]
    if not keys:
        _fail(f"--priority: expected a comma list of retention keys; got {priority!r}")
    try:
        budgets = [int(v) for v in (budget or "0").split(",") if v.strip()]
    except ValueError:
        budgets = []
    if not budgets or any(b < 0 for b in budgets):
        _fail(f"--budget: expected a comma list of non-negative integers; got {budget!r}")
    advice = None
    if advice_path is not None:
        from ..nextuse import load_advice

        advice = load_advice(advice_path)
    results = []
    for key in keys:
        for r in budgets:
            cfg = ProactiveConfig(key, rho=rho, capacity=caps, prefetch_budget=r, tie_break=tie_break, seed=seed,
                                  warmup_events=warm, lrfu_lambda=lrfu_lambda)
            results.append(simulate_prefetch(stream, cfg, profile, advice, issue=issue, expert_bytes=expert_bytes))
    return results


@timing.command("calibrate")
@click.argument("model")
@click.option("--out", "-o", "out", type=click.Path(dir_okay=False), default=None,
              help="Profile JSON to write [default: calibrated-<model>-<device>.json here].")
@click.option("--prompts", type=click.Path(dir_okay=False), default=None,
              help="Prompts JSONL (as for collect) [default: the bundled example prompts].")
@click.option("--device", default="cpu", show_default=True, help="Compute device (cpu, cuda, cuda:1).")
@click.option("--batch", "-B", "batches", default="1,8", show_default=True, callback=_csv(int, "batch sizes"),
              help="Comma list of batch sizes of the calibration runs (two or more separate per-token costs).")
@click.option("--max-new-tokens", type=int, default=32, show_default=True, help="Decode forwards per request.")
@click.option("--max-prompt-tokens", type=int, default=4096, show_default=True, help="Prompt cap.")
@click.option("--no-chat-template", is_flag=True, help="Tokenize prompt text raw.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
              show_default=True)
@click.option("--experts-implementation", type=click.Choice(["eager", "batched_mm", "grouped_mm", "model"]),
              default="eager", show_default=True, help="transformers experts kernel (as for execute).")
@click.option("--threads", type=int, default=None, help="torch CPU threads while measuring [default: torch's].")
@click.option("--clock", type=click.Choice(["wall", "cpu"]), default="wall", show_default=True,
              help="CPU span clock: wall time (what execute records) or the thread's CPU time (steadier on a "
                   "shared machine, with --threads 1). CUDA spans are CUDA events.")
@click.option("--rounds", type=int, default=1, show_default=True,
              help="Repeat the whole measurement and pool the spans (spreads it over the machine's load).")
@click.option("--copy-repeats", type=int, default=200, show_default=True,
              help="Timed standalone copies per buffer size (one and four expert blocks).")
@click.option("--overwrite", is_flag=True, help="Replace an existing output file.")
@click.option("--json", "as_json", is_flag=True, help="Print the profile as one JSON object.")
@_guard
def timing_calibrate(model: str, out: str | None, prompts: str | None, device: str, batches: list[int],
                     max_new_tokens: int, max_prompt_tokens: int, no_chat_template: bool, dtype: str,
                     experts_implementation: str, threads: int | None, clock: str, rounds: int,
                     copy_repeats: int, overwrite: bool, as_json: bool) -> None:
    """Measure a hardware profile on this machine: MODEL's real layers and real host->device copies.

    MODEL is a local model directory of a supported architecture, or 'example' (the example model, rebuilt
    by scripts/example_model/make_all.py). The executor runs the prompts with every expert resident (c = N)
    at each --batch; per MoE layer the dense work and the MoE block are fitted (fixed + per token; fixed +
    per expert + per routed token), the step's own cost is the forward minus its layers, and the link comes
    from timed copies of one and four expert blocks (overlap false: the executor's copies block compute on
    CPU and share the compute stream on CUDA). Writes the
    profile JSON (measured: "measured"; source: machine, device, torch, model, date; fit residuals in
    extra). See docs/timing.md, Calibration.
    """
    import os
    from pathlib import Path

    from ..collect import CollectConfig
    from ..collect.runner import check_placement
    from ..execute.calibrate import CalibrateConfig, calibrate
    from ..timing import save_profile

    if model == "example":
        from ..execute.example import example_model_dir

        model = str(example_model_dir())
    if prompts is None:
        from ..execute.example import example_prompts

        prompts = str(example_prompts())
    if not Path(model).is_dir():
        _fail(f"{model}: no such model directory (expected a local directory with config.json, weights and "
              "tokenizer, or 'example')")
    if not Path(prompts).is_file():
        _fail(f"{prompts}: no such prompts file")
    for name, value, lo in (("--max-new-tokens", max_new_tokens, 1), ("--max-prompt-tokens", max_prompt_tokens, 1),
                            ("--rounds", rounds, 1), ("--copy-repeats", copy_repeats, 3)):
        if value < lo:
            _fail(f"{name} must be >= {lo}; got {value}")
    if threads is not None and threads < 1:
        _fail(f"--threads must be >= 1; got {threads}")
    if any(b < 1 for b in batches):
        _fail(f"--batch sizes must be >= 1; got {','.join(map(str, batches))}")
    check_placement(CollectConfig(device=None if device == "cpu" else device))
    cfg = CalibrateConfig(batches=tuple(batches), max_new_tokens=max_new_tokens, max_prompt_tokens=max_prompt_tokens,
                          chat_template=not no_chat_template, device=device, dtype=dtype,
                          experts_implementation=None if experts_implementation == "model" else experts_implementation,
                          copy_repeats=copy_repeats, threads=threads, clock=clock, rounds=rounds)
    if out is None:
        out = f"calibrated-{os.path.basename(os.path.normpath(model))}-{device.replace(':', '')}.json"
    _require_new(out, overwrite, file=True)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    console = Console(stderr=True)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=True, disable=not console.is_terminal)
    tasks: dict[str, object] = {}
    with bar:
        def progress(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(name, total=total)
            bar.update(tasks[name], completed=done)   # type: ignore[arg-type]

        profile = calibrate(model, prompts, cfg, progress=progress)
    save_profile(profile, out)
    if as_json:
        _echo_json(profile.to_dict())
        return
    _print_profile(profile, out)


def _print_profile(profile, out: str) -> None:
    from rich.table import Table

    fit = profile.extra.get("fit", {})
    table = Table(title=f"{out}: {profile.name}")
    for col in ("MoE layer", "dense fixed us", "dense us/token", "expert fixed us", "expert us/routed token",
                "dense fit |rel| p50", "MoE fit |rel| p50"):
        table.add_column(col, justify="right")
    n = len(profile.dense_fixed_s) if isinstance(profile.dense_fixed_s, tuple) else 1
    costs = profile.per_layer(n)
    for l in range(n):
        d, m = fit.get("dense", [{}] * n)[l], fit.get("moe", [{}] * n)[l]
        table.add_row(str(l), *(f"{costs[i, l] * 1e6:.2f}" for i in range(4)),
                      f"{d.get('median_abs_rel') or 0:.1%}", f"{m.get('median_abs_rel') or 0:.1%}")
    console = _console()
    console.print(table)
    link = fit.get("link", {})
    console.print(f"step: {profile.step_fixed_s * 1e6:.2f} us + {profile.step_per_token_s * 1e6:.3f} us/token "
                  f"(fit |rel| p50 {fit.get('step', {}).get('median_abs_rel') or 0:.1%}); link: "
                  f"{profile.bandwidth / 1e9:.2f} GB/s, {profile.latency_s * 1e6:.2f} us per transfer "
                  f"(standalone copy intercept {link.get('standalone_latency_s', 0) * 1e6:.2f} us), overlap "
                  f"{str(profile.overlap).lower()}, {profile.expert_bytes:,} B per expert", soft_wrap=True)
    console.print(f"source: {profile.source}", soft_wrap=True)
