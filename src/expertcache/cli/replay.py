"""``expertcache replay`` and ``expertcache conformance``."""

from __future__ import annotations

import sys
from dataclasses import replace

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
    _rho_list,
    _stream_batch,
    main,
    read_calibration,
)


def _policy_help() -> str:
    from ..replay.policies import POLICIES  # no numba: the registry is plain data

    return "Comma list of: " + ", ".join(POLICIES) + ", or a policy a --plugin file registers."


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
@click.option("--plugin", "plugins", multiple=True, type=click.Path(dir_okay=False),
              help="Python file that registers policies (register_policy(NAME, key=...), docs/policies.md); "
                   "it is executed. Repeatable.")
@click.option("--expert-bytes", type=int, default=None,
              help="Bytes of one expert block, for bytes moved and bytes per output token [default: the "
                   "stream's or its trace's manifest expert_block_bytes (collect records it), else not reported].")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run (JSON Lines).")
@click.option("--per-layer", "show_layers", is_flag=True, help="Also print the per-layer table.")
@click.option("--jobs", "-j", type=int, default=1, show_default=True,
              help="Worker processes for independent runs (0 = all local cores); results are identical.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write the miss-ratio curves to this .png/.pdf/.svg (needs matplotlib).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --plot file.")
@_guard
def replay_cmd(stream_dir: str, policies: list[str], rhos: list[float], scope: str, semantics: list[str],
               tie_break: str, seed: int, calibration: str | None, lfu_in_cache_counters: bool,
               lrfu_lambda: float, warmup_events: int | None, advice_path: str | None, plugins: tuple[str, ...],
               expert_bytes: int | None, as_json: bool, show_layers: bool, jobs: int, plot_path: str | None,
               overwrite: bool) -> None:
    """Replay STREAM_DIR for every (policy, semantics, rho) and report transfers (§2.4)."""
    from ..events import read_events
    from ..replay import ReplayConfig

    if expert_bytes is not None and expert_bytes < 1:
        _fail(f"--expert-bytes must be a positive integer; got {expert_bytes}")
    if plugins:
        from ..replay.policies import load_plugin

        for path in plugins:
            load_plugin(path)

    configs = [ReplayConfig(policy=p, rho=r, scope=scope, semantics=s, tie_break=tie_break, seed=seed,
                            lfu_in_cache_counters=lfu_in_cache_counters, lrfu_lambda=lrfu_lambda,
                            warmup_events=warmup_events or 0)
               for p in policies for s in semantics for r in rhos]   # validates before any work
    jobs = _jobs(jobs)
    if plot_path and not plot_path.lower().endswith((".png", ".pdf", ".svg")):
        _fail(f"{plot_path}: --plot file must end in .png, .pdf or .svg")
    if plot_path:
        _require_new(plot_path, overwrite, file=True)
    from ..replay import sweep

    stream = read_events(stream_dir, gate_mass=False)          # no replay reads it: 4 bytes per access less
    if warmup_events is None and stream.provenance.get("warmup_events"):
        configs = [replace(c, warmup_events=int(stream.provenance["warmup_events"])) for c in configs]
    calib = read_calibration(calibration, _stream_batch(stream)) if calibration else None
    advice = None
    if advice_path:
        from ..nextuse import load_advice

        advice = load_advice(advice_path, stream=stream)
    with _progress() as bar:
        task = bar.add_task("replay", total=None)
        results = sweep(stream, configs, calib, jobs=jobs, advice=advice,
                        progress=lambda done, total: bar.update(task, completed=done, total=total))
    if plot_path:
        from ..plot import plot_miss_ratio_curves

        plot_miss_ratio_curves(results, plot_path)
    traffic = _bytes_of(stream, results, expert_bytes)
    if as_json:
        from ..storage import stream_source

        source = stream_source(stream_dir)
        for res, tr in zip(results, traffic, strict=True):
            _echo_json({**res.to_dict(), **_bytes_fields(tr, stream, res), **source})
        return
    _print_results(results, show_layers, traffic)
    if plot_path:
        click.echo(f"wrote {plot_path}")


def _bytes_of(stream, results: list, expert_bytes: int | None) -> list:
    """Per result, the bytes it moved (:func:`expertcache.analysis.replay_bytes`), or None without a block size."""
    from ..analysis.traffic import recorded_block_bytes, replay_bytes

    block, source = expert_bytes, "--expert-bytes"
    if block is None:
        block, source = recorded_block_bytes(stream), "manifest expert_block_bytes"
    if block is None:
        return [None] * len(results)
    return [replay_bytes(stream, r.transferred, block, r.warmup_events, source) for r in results]


def _bytes_fields(tr, stream, result) -> dict:
    """JSON fields of the bytes a run moved (null when no block size is known)."""
    if tr is None:
        from ..analysis.traffic import output_tokens

        return {"expert_block_bytes": None, "expert_block_bytes_source": None, "bytes_moved": None,
                "output_tokens": output_tokens(stream, result.warmup_events), "bytes_per_output_token": None}
    return {"expert_block_bytes": tr.expert_block_bytes, "expert_block_bytes_source": tr.source,
            "bytes_moved": tr.bytes_moved, "output_tokens": tr.output_tokens,
            "bytes_per_output_token": tr.bytes_per_output_token}


def _print_results(results: list, show_layers: bool, traffic: list | None = None) -> None:
    from rich.table import Table

    traffic = traffic or [None] * len(results)
    with_bytes = traffic[0] is not None if traffic else False
    console = _console()
    if results:
        r = results[0]
        console.print(f"scope {r.scope}, tie-break {r.tie_break} (seed {r.seed}); {r.n_events} events, "
                      f"logical {r.logical}, union {r.union}, union/logical {r.union_over_logical:.4f} "
                      "(deduplication: the scheduler's, never a policy's)"
                      + (f"; after {r.warmup_events} warm-up events (replayed, not counted)" if r.warmup_events
                         else ""))
        if with_bytes:
            t = traffic[0]
            console.print(f"expert block {t.expert_block_bytes:,} B ({t.source}); {t.output_tokens} output tokens")
    table = Table(title="effective miss fraction m = transferred / logical (§2.4)")
    cols = ("policy", "semantics", "rho", "capacity", "transferred", "initial", "hits", "misses", "m") + \
        (("MB moved", "B/token") if with_bytes else ())
    for col in cols:
        text = col in ("policy", "semantics")
        table.add_column(col, justify="left" if text else "right", no_wrap=True)
    for r, t in zip(results, traffic, strict=True):
        extra = (f"{t.bytes_moved / 1e6:.3f}", "-" if t.bytes_per_output_token is None
                 else f"{t.bytes_per_output_token:,.0f}") if t is not None else ()
        table.add_row(r.policy, r.semantics, f"{r.rho:g}" if r.rho is not None else "-", str(r.capacity_total),
                      str(r.transferred), str(r.initial_load), str(r.hits), str(r.demand_misses),
                      f"{r.miss_fraction:.2%}", *extra)
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


@main.command("conformance")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@_guard
def conformance(as_json: bool) -> None:
    """Replay the bundled conformance trace (§2.5) and compare with the hand-derived counts."""
    from dataclasses import replace

    from ..conformance import CONFORMANCE_CONFIG, EXPECTED, conformance_stream
    from ..replay import replay

    s = conformance_stream()
    out = {}
    ok = True
    for sem, (hits, misses) in EXPECTED.items():
        r = replay(s, replace(CONFORMANCE_CONFIG, semantics=sem))
        out[sem] = {"hits": r.hits, "misses": r.demand_misses, "expected_hits": hits, "expected_misses": misses}
        ok &= (r.hits, r.demand_misses) == (hits, misses)
    if as_json:     # one row per semantics: values are never keys (docs/design.md §5)
        _echo_json({"ok": ok, "union": s.union, "rows": [{"semantics": sem, **v} for sem, v in out.items()]})
    else:
        click.echo(f"conformance trace: 3 layers x 4 experts x 5 steps, {s.union} union accesses; "
                   "lru, rho=0.5 (c_l=2), tie-break id")
        for sem, v in out.items():
            click.echo(f"  {sem:22s} {v['hits']:3d} hits {v['misses']:3d} misses "
                       f"(expected {v['expected_hits']}/{v['expected_misses']})")
        click.echo("OK" if ok else "MISMATCH")
    if not ok:
        sys.exit(1)
