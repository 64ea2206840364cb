"""``expertcache demo``, ``expertcache report`` and ``expertcache align``."""

from __future__ import annotations

import click

from .main import (
    _console,
    _csv,
    _echo_json,
    _fail,
    _guard,
    _jobs,
    _progress,
    _require_new,
    main,
)


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
    from ..replay import ReplayConfig
    from ..report.demo import DEMO_SEMANTICS, run_demo

    if batch < 1:
        _fail(f"--batch must be a positive integer; got {batch}")
    ReplayConfig(rho=rho, seed=seed)  # validate
    with _progress() as bar:
        task = bar.add_task("demo replays", total=None)

        def tick(total: int) -> None:
            bar.update(task, total=total, advance=1)

        report = run_demo(batch=batch, rho=rho, seed=seed, progress=tick, example=example)
    if as_json:
        _echo_json(report.to_dict())
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
@click.option("--seed", "seeds", default="0,1,2,3,4", show_default=True, callback=_csv(int, "integers"),
              help="Tie seeds for the gap (spread = implementation stability).")
@click.option("--sweep-batch", "batches", default="1,2,4,8,16", show_default=True, callback=_csv(int, "integers"),
              help="B sweep (traces only).")
@click.option("--sweep-rho", "rhos", default="0.2,0.3,0.4", show_default=True, callback=_csv(float, "numbers"),
              help="rho sweep.")
@click.option("--permutations", type=int, default=5, show_default=True, help="Step permutations (§6.5).")
@click.option("--block-bytes", type=float, default=None,
              help="Bytes per expert block (default: the input manifest's expert_block_bytes if declared).")
@click.option("--block-bytes-preset", type=click.Choice(["frontier-reference"]), default=None,
              help="Use the §3.2 reference frame's 16.74 MiB blocks; figures are labelled projections.")
@click.option("--target-tokens-per-s", type=float, default=None, help="Target service rate (tokens/s).")
@click.option("--bandwidth", type=float, default=None,
              help="Host-to-device bandwidth budget (bytes/s) [default: the --profile's bandwidth].")
@click.option("--profile", "profile", default=None,
              help="A hardware profile (built-in name or JSON, docs/timing.md): adds the time section (policy x "
                   "TPOT, tokens/s, stall share, bytes/token) and gives the §6.6 budget its bandwidth.")
@click.option("--nextuse-model", type=click.Path(dir_okay=False), default=None,
              help="A next-use model fitted on a disjoint stream: adds the Tables 15-16 section.")
@click.option("--labels", type=click.Path(dir_okay=False), default=None,
              help="Request categories for the workload diagnostics (CSV 'request_id,category' or JSON Lines; "
                   "default: the trace's own, else one category). With 'arm' and 'source_id' columns (a probe set's "
                   "labels) B8 matched-pair attribution is measured; the bundled "
                   "src/expertcache/data/example_matched_trace has example_matched_labels.jsonl with both arms.")
@click.option("--prompts", type=click.Path(), default=None,
              help="The prompts (JSON Lines or a probe-set directory) for the prompt-side fields (B1).")
@click.option("--jobs", "-j", type=int, default=1, show_default=True, help="Worker processes (0 = all cores).")
@click.option("--no-figures", is_flag=True, help="Skip the figures (no matplotlib needed).")
@click.option("--overwrite", is_flag=True, help="Replace an existing output directory.")
@click.option("--json", "as_json", is_flag=True,
              help="Print {out, files, report} as one JSON object (report: what report.json holds).")
@_guard
def report_cmd(source: str | None, example: bool, out: str, rho: float, scope: str, batch: int, offsets: str,
               seeds: list[int], batches: list[int], rhos: list[float], permutations: int,
               block_bytes: float | None, block_bytes_preset: str | None, target_tokens_per_s: float | None,
               bandwidth: float | None, profile: str | None, nextuse_model: str | None, labels: str | None,
               prompts: str | None, jobs: int, no_figures: bool, overwrite: bool, as_json: bool) -> None:
    """Measure SOURCE (a trace or stream directory) and write the reporting block, tables and figures."""
    from importlib import resources

    from ..report import ReportConfig, build_report, write_report

    if bool(source) == example:
        _fail("give either SOURCE (a trace or stream directory) or --example")
    jobs = _jobs(jobs)
    _require_new(out, overwrite)
    cfg = ReportConfig(rho=rho, scope=scope, batch=batch, offsets=offsets, seeds=tuple(seeds),
                       batches=tuple(batches), rhos=tuple(rhos), n_permutations=permutations,
                       block_bytes=block_bytes, block_bytes_preset=block_bytes_preset,
                       target_tokens_per_s=target_tokens_per_s,
                       bandwidth_budget=bandwidth, profile=profile, nextuse_model=nextuse_model, labels=labels, prompts=prompts,
                       jobs=jobs)
    # the complete, canonical command (defaults spelled out), so the report can be regenerated exactly
    command = " ".join([
        "expertcache report", "--example" if example else source, "-o", out, "--rho", f"{rho:g}", "--scope", scope,
        "--batch", str(batch), "--offsets", offsets, "--seed", ",".join(map(str, seeds)),
        "--sweep-batch", ",".join(map(str, batches)), "--sweep-rho", ",".join(f"{r:g}" for r in rhos),
        "--permutations", str(permutations),
        *(["--block-bytes", f"{block_bytes:g}"] if block_bytes else []),
        *(["--block-bytes-preset", block_bytes_preset] if block_bytes_preset else []),
        *(["--target-tokens-per-s", f"{target_tokens_per_s:g}"] if target_tokens_per_s else []),
        *(["--bandwidth", f"{bandwidth:g}"] if bandwidth else []),
        *(["--profile", profile] if profile else []),
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
    skipped = rep.data.get("figures")
    if as_json:
        from pathlib import Path

        _echo_json({"out": out, "files": sorted(p.relative_to(out).as_posix() for p in Path(out).rglob("*")
                                                if p.is_file() and not p.name.startswith(".")),
                    "report": rep.data})
        return
    click.echo(rep.block, nl=False)
    click.echo(f"wrote {out}/report.md, report.json, block.txt"
               + ("" if no_figures or skipped else " and figures/") + (f"; figures {skipped}" if skipped else ""))


@main.command("align")
@click.argument("traces", nargs=-1, required=True)
@click.option("--sweep-batch", "batches", default="1,2,4,8,16", show_default=True, callback=_csv(int, "integers"),
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
    from ..analysis import align, reference_frame_r_null, regime_grid
    from ..replay import ReplayConfig
    from ..trace import read_trace

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
            _echo_json(r.to_dict())
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
