"""``expertcache events``: build, import and inspect event streams."""

from __future__ import annotations

import click

from .main import (
    _echo_json,
    _fail,
    _guard,
    _require_new,
    _working,
    main,
)


@main.group()
def events() -> None:
    """Event streams: build from a trace, import, inspect."""


@events.command("build")
@click.argument("trace_dir", type=click.Path())
@click.option("--batch", "-B", type=int, required=True, help="Concurrency B (max active requests per step).")
@click.option("--offsets", default="zero", show_default=True,
              help="Arrivals: zero, stagger:D (request i arrives at i*D), random:LO:HI (seeded), poisson:RATE "
                   "(a seeded Poisson process of RATE requests per step) or file:PATH (CSV request_id,arrival_step, "
                   "or one step per line in the trace's order); admission is FCFS by arrival.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of random and poisson arrivals.")
@click.option("--prefill-init", is_flag=True,
              help="Prefill-initialised cache (CLR §4.1): prepend the chunked prefill of the first batch as "
                   "warm-up events, which replay fills the cache with but does not count.")
@click.option("--prefill-chunk", type=int, default=128, show_default=True, help="Prefill chunk size in tokens.")
@click.option("--prefill-order", type=click.Choice(["chunk-major", "layer-major"]), default="chunk-major",
              show_default=True, help="Execution order of the warm-up prefill.")
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False), help="Stream directory to create.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output directory.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as one JSON object.")
@_guard
def events_build(trace_dir: str, batch: int, offsets: str, seed: int, prefill_init: bool, prefill_chunk: int,
                 prefill_order: str, out: str, overwrite: bool, as_json: bool) -> None:
    """Schedule the decode routing of TRACE_DIR under FCFS continuous batching."""

    from ..events import ArrivalOffsets, build_events
    from ..trace import read_trace

    _require_new(out, overwrite)
    if batch < 1:
        _fail(f"--batch must be a positive integer; got {batch}")
    offs = ArrivalOffsets.parse(offsets, seed=seed)
    with _working("building events"):
        if prefill_init:
            from ..events.prefill import prefill_initialised_events

            stream = prefill_initialised_events(read_trace(trace_dir), batch, prefill_chunk, prefill_order, offs)
        else:
            stream = build_events(read_trace(trace_dir), batch, offs)
        stream.save(out, overwrite=overwrite)
    warm = int(stream.provenance.get("warmup_events", 0))
    if as_json:
        _echo_json(_written(out, stream))
        return
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
@click.option("--json", "as_json", is_flag=True, help="Print what was written as one JSON object.")
@_guard
def events_import(events_jsonl: str, layers: int, experts: int, top_k: int, out: str, overwrite: bool,
                  as_json: bool) -> None:
    """Import EVENTS_JSONL (event records, docs/design.md §3), e.g. a hand-written stream."""

    from ..events import import_events_jsonl

    _require_new(out, overwrite)
    with _working("importing events"):
        stream = import_events_jsonl(events_jsonl, layers, experts, top_k)
        stream.save(out, overwrite=overwrite)
    if as_json:
        _echo_json(_written(out, stream))
        return
    click.echo(f"wrote {out}: {stream.n_events} events, union {stream.union}, logical {stream.logical}")


def _written(out: str, stream) -> dict:
    """What ``events build`` and ``events import`` wrote, as the record their ``--json`` prints."""
    from ..storage import stream_source

    return {**stream_source(out), "n_layers": stream.n_layers, "n_experts": stream.n_experts,
            "top_k": stream.top_k, "n_events": stream.n_events, "union": stream.union, "logical": stream.logical,
            "union_over_logical": stream.union / stream.logical if stream.logical else None,
            "warmup_events": int(stream.provenance.get("warmup_events", 0))}


@events.command("info")
@click.argument("stream_dir", type=click.Path())
@click.option("--rho", type=float, default=0.4, show_default=True, help="Residency fraction for the event ratio.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@_guard
def events_info(stream_dir: str, rho: float, as_json: bool) -> None:
    """Validate STREAM_DIR and summarise it, with the event ratio r = |E|/c_l (§6.1)."""
    import numpy as np

    from ..analysis import regime_stats
    from ..events import read_events
    from ..trace.provenance import shape_caveat

    if not 0.0 <= rho <= 1.0:
        _fail(f"--rho must be in [0, 1]; got {rho}")
    s = read_events(stream_dir)
    rg = regime_stats(s, rho)
    info = {"n_layers": s.n_layers, "n_experts": s.n_experts, "top_k": s.top_k, "n_events": s.n_events,
            "n_steps": int(np.unique(s.step).shape[0]), "union": s.union, "logical": s.logical,
            "union_over_logical": s.union / s.logical, "mean_union": rg.union_mean,
            "p95_union": rg.union_p95, "rho": rho, "capacity_mean": rg.capacity_mean,
            "capacity_caveat": shape_caveat(s.provenance, s.n_experts), "mean_event_ratio": rg.r_mean,
            "fraction_events_over_capacity": rg.r_fraction_over_1, "provenance": s.provenance}
    if as_json:
        _echo_json(info)
        return
    caveat = info.pop("capacity_caveat")
    from ..trace.provenance import provenance_summary

    info["provenance"] = provenance_summary(s.provenance) + " (--json for all)"
    for key, value in info.items():
        click.echo(f"{key:30s} {value:.4f}" if isinstance(value, float) else f"{key:30s} {value}")
        if caveat and key in ("n_experts", "capacity_mean", "fraction_events_over_capacity"):
            click.echo(f"{'':30s} ({caveat})")


# ---------------------------------------------------------------------------- replay


@events.command("export")
@click.argument("stream_dir", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["oraclegeneral", "csv"]), default="oraclegeneral",
              show_default=True, help="libCacheSim trace format: binary oracleGeneral (with next-access times, "
                                      "needed by Belady) or CSV (time,obj_id,obj_size).")
@click.option("--scope", type=click.Choice(["per-layer", "global"]), default="per-layer", show_default=True,
              help="One trace per layer with its quota c_l, or one trace of block ids with the total capacity.")
@click.option("--rho", type=float, default=0.4, show_default=True, help="Residency fraction of the capacities.")
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False), help="Directory to create.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output directory.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as one JSON object.")
@_guard
def events_export(stream_dir: str, fmt: str, scope: str, rho: float, out: str, overwrite: bool,
                  as_json: bool) -> None:
    """Write STREAM_DIR's accesses as libCacheSim traces (sequential-ascending order) with their capacities.

    export.json in the output lists every trace with the capacity to give libCacheSim; see docs/libcachesim.md
    for the commands and where libCacheSim's semantics differ from expertcache's.
    """
    from pathlib import Path

    from ..events import read_events
    from ..replay.libcachesim import export_stream
    from ..storage import MANIFEST, sha256_file

    _require_new(out, overwrite)
    stream = read_events(stream_dir)
    info = {"path": str(Path(stream_dir)), "manifest_sha256": sha256_file(Path(stream_dir) / MANIFEST)}
    result = export_stream(stream, out, fmt, scope, rho, overwrite=overwrite, stream_info=info)
    if as_json:
        _echo_json(result.to_dict())
        return
    n = sum(t.n_requests for t in result.traces)
    click.echo(f"wrote {len(result.traces)} {fmt} trace(s), {n:,} requests, to {out} "
               f"({scope}, capacities at rho={rho:g} in {out}/export.json)")
    for note in result.notes:
        click.echo(f"note: {note}")
