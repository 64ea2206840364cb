"""``expertcache trace``: import foreign routing, inspect a trace."""

from __future__ import annotations

import json

import click

from .main import (
    _fail,
    _guard,
    _require_new,
    main,
)


@main.group()
def trace() -> None:
    """Routing traces: import and inspect."""


@trace.command("import")
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--format", "fmt", type=click.Choice(["routes-jsonl", "mixtral-jsonl", "deepseek-csv"]),
              default="routes-jsonl", show_default=True,
              help="routes-jsonl: this project's records (docs/design.md §3); mixtral-jsonl: one row per (request, "
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
        from ..trace import import_routes_jsonl

        if len(sources) != 1 or None in (layers, experts, top_k):
            _fail("--format routes-jsonl takes one file and needs --layers, --experts and --top-k")
        prov["source"] = prov["source"][0]
        tr = import_routes_jsonl(sources[0], layers, experts, top_k, provenance=prov)
    elif fmt == "mixtral-jsonl":
        from ..trace.importers import import_mixtral_jsonl

        if len(sources) != 1:
            _fail(f"--format mixtral-jsonl takes one file; got {len(sources)}")
        tr, report = import_mixtral_jsonl(sources[0], n_layers=layers, n_experts=experts, top_k=top_k, phase=phase,
                                          skip_bad_rows=skip_bad_rows, provenance=prov)
    else:
        from ..trace.importers import import_deepseek_csv

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
    from ..trace import DECODE, read_trace

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
