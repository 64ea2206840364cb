"""``expertcache prefetch``: prefetch and activation-aware baselines charged for proactive loads (docs/prefetch.md)."""

from __future__ import annotations

from typing import Any

import click

from .main import _console, _echo_json, _fail, _guard, _jobs, _progress, _require_new


@click.group("prefetch")
def prefetch() -> None:
    """Prefetchers and MoE-specific caches on one trace, every proactive load charged (CLR Table 1 shape)."""


def _load_source(path: str):
    """A routing trace or an event stream from a directory (by its manifest kind); 'example' = the bundled trace."""
    import os
    from importlib import resources

    from ..errors import ValidationError
    from ..storage import read_manifest

    if path == "example" and not os.path.exists(path):
        ref = resources.files("expertcache") / "data" / "example_trace"
        with resources.as_file(ref) as p:
            return _load_source(str(p))
    kind = None
    for k in ("routing_trace", "event_stream"):
        try:
            read_manifest(path, k)
            kind = k
            break
        except ValidationError:
            continue
    if kind is None:
        raise ValidationError("expected a routing trace or an event stream directory written by expertcache",
                              source=path)
    if kind == "event_stream":
        from ..events import read_events

        return read_events(path), None, path
    from ..trace import read_trace

    return read_trace(path), path, path


def _hidden(trace_dir: str | None, use: bool):
    """Collected hidden states of a trace directory, or None (and why)."""
    if trace_dir is None or not use:
        return None, "not requested" if not use else "event stream input"
    from ..collect import read_array
    from ..errors import ValidationError

    try:
        return read_array(trace_dir, "hidden"), "hidden states"
    except ValidationError as exc:
        return None, f"none ({exc.detail})"


@prefetch.command("compare")
@click.argument("source", type=click.Path())
@click.option("--calibration", type=click.Path(file_okay=False), default=None,
              help="Trace the predictors and stores are fitted on (default: the even requests of SOURCE; "
                   "its odd requests are evaluated). A trace, not a stream: they learn from token-level routing.")
@click.option("--rho", type=float, default=0.25, show_default=True,
              help="Residency fraction (per-layer quotas); 0.25 is CLR's setting, B = 8 of N = 32.")
@click.option("--capacity", "-C", type=int, default=None, help="Experts per layer (CLR's B); overrides --rho.")
@click.option("--budget", "-R", type=int, default=None,
              help="Candidate budget R of prefetching rows [default: 75% of the smallest capacity].")
@click.option("--batch", type=int, default=1, show_default=True, help="FCFS continuous-batching concurrency.")
@click.option("--prefill-init/--no-prefill-init", default=None,
              help="Start each request's decode from its prefill's cache [default: when batch is 1 and the "
                   "trace has prompts].")
@click.option("--lookahead", type=int, default=3, show_default=True, help="ProMoE-style lookahead distance d.")
@click.option("--store-size", type=int, default=1000, show_default=True,
              help="Entries of the EAM / expert-map stores.")
@click.option("--option-steps", type=int, default=4, show_default=True, help="Option length (steps) of te-moe.")
@click.option("--lrfu-lambda", type=float, default=0.5, show_default=True, help="LRFU decay lambda.")
@click.option("--expert-bytes", type=int, default=None,
              help="Bytes per expert block (S_expert) for Load/token in MB [default: the trace's "
                   "expert_block_bytes when its manifest declares one, else Load/token is in blocks].")
@click.option("--policy", "policies", default=None, help="Comma list of baselines [default: all].")
@click.option("--seed", type=int, default=0, show_default=True, help="Tie ranks and store sampling.")
@click.option("--tie-break", type=click.Choice(["random", "id"]), default="random", show_default=True)
@click.option("--hidden/--no-hidden", "use_hidden", default=True, show_default=True,
              help="Use collected hidden states when the trace has them (else routing-derived features).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write a figure (.png/.svg/.pdf): Hit and AdjHit bars, Load/token points.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --plot file.")
@click.option("--profile", "profile_name", default=None,
              help="A hardware profile (built-in name or JSON, docs/timing.md): time every row too, its prefetches "
                   "issued at its decision availability and sharing the link with demand misses (TPOT, stall "
                   "share, timely/late/useless prefetches); needs a block size (--expert-bytes or the trace's).")
@click.option("--jobs", "-j", type=int, default=1, show_default=True,
              help="Baselines run side by side in this many threads (0 = all local cores); the rows are the same, "
                   "and up to this many baselines' advice arrays are held at once.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@_guard
def compare_cmd(source: str, calibration: str | None, rho: float, capacity: int | None, budget: int | None,
                batch: int, prefill_init: bool | None, lookahead: int, store_size: int, option_steps: int,
                lrfu_lambda: float, expert_bytes: int | None, policies: str | None, seed: int, tie_break: str,
                use_hidden: bool, plot_path: str | None, overwrite: bool, profile_name: str | None, jobs: int,
                as_json: bool) -> None:
    """Compare classic, MoE-specific and prefetching baselines on SOURCE (a trace or stream directory,
    or 'example' for the bundled trace): Hit, AdjHit, Load per token, added parameters, decision availability.
    """
    from ..prefetch.comparison import CompareConfig, compare, plot_compare
    from ..trace import RoutingTrace

    jobs = _jobs(jobs)
    if plot_path:
        _require_new(plot_path, overwrite, file=True)
    names = tuple(p.strip() for p in policies.split(",") if p.strip()) if policies else None
    cfg = CompareConfig(rho=rho, capacity=capacity, budget=budget, batch=batch, prefill_init=prefill_init,
                        lookahead=lookahead, store_size=store_size, option_steps=option_steps,
                        lrfu_lambda=lrfu_lambda, seed=seed, tie_break=tie_break,
                        expert_bytes=expert_bytes, policies=names)
    profile = None
    if profile_name is not None:
        from ..timing import load_profile

        profile = load_profile(profile_name)
    data, trace_dir, label = _load_source(source)
    declared = _declared_bytes(data)
    if expert_bytes is None and declared:
        expert_bytes = declared
        cfg = CompareConfig(**{**cfg.__dict__, "expert_bytes": expert_bytes})
    if profile is not None and expert_bytes is None and profile.expert_bytes is None:
        from ..errors import ValidationError

        raise ValidationError("timing needs the expert block size: pass --expert-bytes BYTES (the trace "
                              "declares none)", source=source)
    hidden, _ = _hidden(trace_dir, use_hidden) if isinstance(data, RoutingTrace) else (None, "")
    calib = hidden_cal = None
    if calibration is not None:
        calib, cal_dir, _ = _load_source(calibration)
        if not isinstance(calib, RoutingTrace):
            from ..errors import ValidationError

            raise ValidationError("--calibration must be a routing trace directory: the predictors and stores "
                                  "learn from token-level routing (request, position, layer), which an event "
                                  "stream no longer holds; give the trace the stream was built from",
                                  source=calibration)
        hidden_cal, _ = _hidden(cal_dir, use_hidden and hidden is not None)
        if hidden_cal is None:
            hidden = None
    with _progress() as bar:
        task = bar.add_task("baselines", total=None)

        def tick(total: int) -> None:
            bar.update(task, total=total, advance=1)

        report = compare(data, cfg, calibration=calib, hidden=hidden, hidden_calibration=hidden_cal,
                         label="example" if source == "example" else label, progress=tick, profile=profile,
                         jobs=jobs)
    if plot_path:
        plot_compare(report, plot_path)
    if as_json:
        _echo_json(report.to_dict())
        return
    from rich.table import Table

    mb = expert_bytes is not None
    table = Table(title=f"Proactive-load-aware comparison — {report.source}", title_justify="left")
    for col in ("family", "policy", "Hit %", "AdjHit %", "MB/token" if mb else "blocks/token", "P", "m",
                "added params", "decision availability"):
        table.add_column(col, justify="right" if col in ("Hit %", "AdjHit %", "MB/token", "blocks/token", "P", "m",
                                                         "added params") else "left")
    for row in report.rows:
        r = row.result
        if r is None:
            table.add_row(row.family, row.name, "-", "-", "-", "-", "-", "-", "skipped (see below)")
            continue
        load = r.load_per_token / 1e6 if mb else r.load_per_token
        table.add_row(row.family, row.name, f"{100 * r.hit:.2f}", f"{100 * r.adj_hit:.2f}", f"{load:.2f}",
                      str(r.proactive_loads), f"{r.miss_fraction:.4f}", f"{row.added_params:,}",
                      row.availability)
    console = _console()
    console.print(table)
    caps = report.capacity_per_layer
    cap = f"{min(caps)}" if min(caps) == max(caps) else f"{min(caps)}-{max(caps)}"
    if report.n_eval_requests is None:
        start = (f"its first {report.warmup_events} events (prefill warm-up) replayed, not counted"
                 if report.warmup_events else "cold cache, every event counted")
        where = f"event stream as built (batch {report.batch if report.batch is not None else 'unknown'}, {start})"
    else:
        where = (f"batch {report.batch}, prefill-initialised: {report.prefill_init}, features: {report.hidden}; "
                 f"evaluated requests: {report.n_eval_requests}, calibration requests: "
                 f"{report.n_calibration_requests}")
    console.print(f"capacity per layer {cap}, R = {report.budget}, {where}. Hit = 1 - D/A, "
                  "AdjHit = (A - D)/(A + P), Load/token = (D + P) S_expert / T, m = (D + P)/logical.")
    for row in report.rows:
        text = f"skipped: {row.skipped}" if row.result is None else row.note
        if text:
            console.print(f"  {row.name}: {text}")
    if profile is not None:
        console.print(_timing_table(report, profile))
    if plot_path:
        console.print(f"figure: {plot_path}")


def _timing_table(report: Any, profile: Any) -> Any:
    """The rows on the timeline: TPOT, tokens/s, stall share and the prefetches split by timeliness."""
    from rich.table import Table

    table = Table(title=f"On the timeline — profile {profile.name} ({profile.measured}); prefetches issued at "
                        "each row's decision availability", title_justify="left")
    for col in ("policy", "issued at", "TPOT mean ms", "TPOT p99 ms", "tokens/s", "stall share", "P", "timely",
                "late", "useless"):
        table.add_column(col, justify="left" if col in ("policy", "issued at") else "right")
    for row in report.rows:
        t = row.timing
        if t is None:
            continue
        table.add_row(row.name, t.issue if t.prefetch_budget else "-", f"{t.tpot_mean_s * 1e3:.3f}",
                      f"{t.tpot_p99_s * 1e3:.3f}", f"{t.tokens_per_s:,.1f}", f"{t.stall_share:.1%}",
                      f"{t.prefetch_loads:,}", f"{t.prefetch_timely:,}", f"{t.prefetch_late:,}",
                      f"{t.prefetch_useless:,}")
    return table


def _declared_bytes(data: Any) -> int | None:
    """The trace's (or a stream's trace's) ``expert_block_bytes``, when its manifest declares one."""
    prov = getattr(data, "provenance", {}) or {}
    for p in (prov, prov.get("trace_provenance") or {}):
        v = p.get("expert_block_bytes") if isinstance(p, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return int(v)
    return None


def _ints(text: str, name: str) -> list[int]:
    try:
        out = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected a comma list of integers; got {text!r}", param_hint=name) from None
    if not out or any(v < 0 for v in out):
        raise click.BadParameter(f"expected non-negative integers; got {text!r}", param_hint=name)
    return out


@prefetch.command("advice")
@click.argument("stream_dir", type=click.Path(file_okay=False))
@click.option("--producer", type=click.Choice(["te-moe", "te-moe-oracle", "next-true"]), default="te-moe",
              show_default=True,
              help="te-moe: each option window's experts from the previous window (causal); te-moe-oracle: from "
                   "the window itself (an upper bound); next-true: every event's own experts (an oracle).")
@click.option("--option-steps", type=int, default=4, show_default=True, help="Steps per option window (te-moe).")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="Advice .npz to write.")
@click.option("--overwrite", is_flag=True, help="Replace an existing advice file.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_guard
def advice_cmd(stream_dir: str, producer: str, option_steps: int, out: str, overwrite: bool, as_json: bool) -> None:
    """Write a stream-only prefetch baseline's advice (priority and/or prefetch_score) for `prefetch replay`."""
    from ..events import read_events
    from ..nextuse import save_advice
    from ..prefetch.options import next_true, option_set
    from ..storage import atomic_file

    if not out.endswith(".npz"):
        _fail(f"{out}: advice is written as .npz")
    _require_new(out, overwrite, file=True)
    stream = read_events(stream_dir)
    warm = int(stream.provenance.get("warmup_events", 0) or 0)
    mask = None
    if warm:
        import numpy as np

        mask = np.arange(stream.n_events) >= warm
    produced = (next_true(stream, mask) if producer == "next-true"
                else option_set(stream, option_steps, "past" if producer == "te-moe" else "future", mask))
    with atomic_file(out) as tmp:
        save_advice(produced.advice, tmp)
    info = {"out": out, "producer": producer, "fields": list(produced.advice.fields_present()),
            "replay_priority": produced.priority, "prefetch": produced.prefetch,
            "availability": produced.availability, "n_events": stream.n_events}
    if as_json:
        _echo_json(info)
        return
    click.echo(f"wrote {out}: {producer} advice ({', '.join(info['fields'])}) for {stream.n_events} events; "
               f"replay it with --priority {produced.priority} -R <budget>; decision availability: "
               f"{produced.availability}")


@prefetch.command("replay")
@click.argument("stream_dir", type=click.Path(file_okay=False))
@click.option("--advice", "advice_path", type=click.Path(dir_okay=False), default=None,
              help="Advice .npz (priority and/or prefetch_score aligned to STREAM_DIR's events).")
@click.option("--priority", default="lru", show_default=True,
              help="Comma list of retention keys: lru, lfu, lfru, lrfu, advice (U_B on the advice priority).")
@click.option("--budget", "-R", default="0", show_default=True,
              help="Comma list of candidate budgets R (0 = no pre-access refinement); one replay each.")
@click.option("--rho", type=float, default=0.4, show_default=True, help="Residency fraction (per-layer quotas).")
@click.option("--capacity", "-C", type=int, default=None, help="Experts per layer (CLR's B); overrides --rho.")
@click.option("--warmup", type=int, default=None,
              help="Leading events that fill the cache but are not counted (e.g. prefill events) [default: the "
                   "stream's own warm-up, as written by `expertcache events build --prefill-init`, else 0].")
@click.option("--lrfu-lambda", type=float, default=0.5, show_default=True, help="LRFU decay lambda.")
@click.option("--expert-bytes", type=int, default=None, help="Bytes per expert block for Load/token in MB.")
@click.option("--seed", type=int, default=0, show_default=True, help="Tie ranks.")
@click.option("--tie-break", type=click.Choice(["random", "id"]), default="random", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per replay, one per line.")
@_guard
def replay_cmd(stream_dir: str, advice_path: str | None, priority: str, budget: str, rho: float,
               capacity: int | None, warmup: int | None, lrfu_lambda: float, expert_bytes: int | None, seed: int,
               tie_break: str, as_json: bool) -> None:
    """Replay STREAM_DIR with pre-access refinement and a retention key, charging every proactive load
    (Hit, AdjHit, Load per token, m). Several budgets replay the same advice (CLR Table 3's R sweep)."""
    from ..events import read_events
    from ..replay.proactive import ProactiveConfig, replay_proactive

    stream = read_events(stream_dir)
    if warmup is None:
        warmup = int(stream.provenance.get("warmup_events", 0) or 0)
    advice = None
    if advice_path is not None:
        from ..nextuse import load_advice

        advice = load_advice(advice_path)
    caps = None if capacity is None else (int(capacity),) * stream.n_layers
    results = []
    keys = [p.strip() for p in priority.split(",") if p.strip()]
    if not keys:
        raise click.BadParameter(f"expected a comma list of retention keys; got {priority!r}",
                                 param_hint="--priority")
    for prio in keys:
        for r in _ints(budget, "--budget"):
            cfg = ProactiveConfig(prio, rho=rho, capacity=caps, prefetch_budget=r, tie_break=tie_break, seed=seed,
                                  warmup_events=warmup, lrfu_lambda=lrfu_lambda, expert_bytes=expert_bytes)
            results.append(replay_proactive(stream, cfg, advice))
    if as_json:
        from ..storage import stream_source

        for res in results:
            _echo_json({**res.to_dict(per_layer=False), **stream_source(stream_dir)})
        return
    from rich.table import Table

    mb = expert_bytes is not None
    table = Table(title=f"Proactive-load-aware replay — {stream_dir}", title_justify="left")
    for col in ("priority", "R", "Hit %", "AdjHit %", "MB/token" if mb else "blocks/token", "D", "P", "useful P",
                "m"):
        table.add_column(col, justify="left" if col == "priority" else "right")
    for res in results:
        load = res.load_per_token / 1e6 if mb else res.load_per_token
        table.add_row(res.priority, str(res.prefetch_budget), f"{100 * res.hit:.2f}", f"{100 * res.adj_hit:.2f}",
                      f"{load:.3f}", str(res.demand_misses), str(res.proactive_loads), str(res.useful_prefetches),
                      f"{res.miss_fraction:.4f}")
    _console().print(table)
