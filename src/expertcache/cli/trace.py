"""``expertcache trace``: import foreign routing, inspect a trace."""

from __future__ import annotations

import json

import click

from .main import (
    _echo_json,
    _fail,
    _guard,
    _require_new,
    _working,
    main,
)

_FORMATS = ["routes-jsonl", "mixtral-jsonl", "deepseek-csv", "warp-jsonl", "columnar"]


@main.group()
def trace() -> None:
    """Routing traces: import and inspect."""


@trace.command("import")
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--format", "fmt", type=click.Choice(_FORMATS), default="routes-jsonl", show_default=True,
              help="routes-jsonl: this project's records (docs/design.md §3); mixtral-jsonl: one row per (request, "
                   "token, layer) as a vLLM profiler published for Mixtral-8x7B; deepseek-csv: per-text CSV files "
                   "'Layer ID,Batch Number,Token,Activated Expert IDs' (one teacher-forced forward each, as published "
                   "for DeepSeek-V2-Lite); warp-jsonl: {\"tok\", \"layers\"} per decode step (warp's trace_hf.py); "
                   "columnar: Parquet, CSV or JSON Lines with --map (docs/importers.md).")
@click.option("--layers", "-L", type=int, default=None, help="MoE layers L (required for routes-jsonl; "
              "inferred for the other formats when omitted).")
@click.option("--experts", "-N", type=int, default=None, help="Routed experts per layer N (inferred: max id + 1, "
              "a lower bound).")
@click.option("--top-k", "-k", type=int, default=None, help="Experts per token k (inferred: the commonest row length).")
@click.option("--phase", type=click.Choice(["decode", "prefill"]), default="decode", show_default=True,
              help="The phase of tokens the data do not mark: mixtral-jsonl rows without a 'phase' field, every "
                   "deepseek-csv token (teacher-forced; 'prefill' marks them prompt, and then events build has "
                   "nothing to schedule), columnar files without a phase column.")
@click.option("--map", "mapping", default=None, metavar="FIELD=COLUMN,...",
              help="columnar: which column holds each field, e.g. request=req_id,position=token_idx,layer=layer,"
                   "experts=topk_ids,gates=topk_weights; request=@file (the file name) or request=@const:NAME.")
@click.option("--category-from", "category_from", default=None, metavar="dataset|file|COLUMN",
              help="Take each request's category from the data (written to the trace's provenance, so audit and "
                   "the experiments need no labels file): 'file' (the file name), or a field/column such as "
                   "mixtral-jsonl's 'dataset'.")
@click.option("--prefill-batches", type=int, default=None, hidden=True)
@click.option("--skip-bad-rows", is_flag=True, help="Foreign formats: count and skip unreadable rows instead of "
              "stopping at the first.")
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False), help="Trace directory to create.")
@click.option("--model", default=None, help="Model id recorded in the manifest's provenance.")
@click.option("--json", "as_json", is_flag=True, help="Print the import report as JSON.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output directory.")
@_guard
def trace_import(sources: tuple[str, ...], fmt: str, layers: int | None, experts: int | None, top_k: int | None,
                 phase: str, mapping: str | None, category_from: str | None, prefill_batches: int | None,
                 skip_bad_rows: bool, out: str, model: str | None, as_json: bool, overwrite: bool) -> None:
    """Import SOURCES (files or directories of routing records) into a trace directory.

    Several files are read as one trace: their requests in order (a request id found in two
    files is one request).
    """
    import os

    from ..trace.provenance import shape_caveat

    if prefill_batches is not None:
        _fail("--prefill-batches is gone: a deepseek-csv 'Batch Number' is the row of one forward pass's batch, "
              "not a generation step. Every token is imported as decode (teacher-forced) by default; "
              "--phase prefill marks them prefill")
    if mapping is not None and fmt != "columnar":
        _fail(f"--map applies to --format columnar; got --format {fmt}")
    _require_new(out, overwrite)
    prov: dict = {"source": [os.path.basename(s) for s in sources], "format": fmt}
    if model:
        prov["model"] = model
    report = None
    shape = dict(n_layers=layers, n_experts=experts, top_k=top_k)
    with _working(f"importing {fmt}"):
        if fmt == "routes-jsonl":
            from ..trace import import_routes_jsonl

            if None in (layers, experts, top_k):
                _fail("--format routes-jsonl needs --layers, --experts and --top-k")
            if skip_bad_rows:
                _fail("--skip-bad-rows applies to the foreign formats; a routes-jsonl file must be valid")
            if len(sources) == 1:
                prov["source"] = prov["source"][0]
            tr = import_routes_jsonl(list(sources), layers, experts, top_k, provenance=prov, category_from=category_from)
        elif fmt == "mixtral-jsonl":
            from ..trace.importers import import_mixtral_jsonl

            tr, report = import_mixtral_jsonl(list(sources), **shape, phase=phase, skip_bad_rows=skip_bad_rows,
                                              category_from=category_from, provenance=prov)
        elif fmt == "deepseek-csv":
            from ..trace.importers import import_deepseek_csv

            tr, report = import_deepseek_csv(list(sources), **shape, phase=phase, skip_bad_rows=skip_bad_rows,
                                             category_from=category_from, provenance=prov)
        elif fmt == "warp-jsonl":
            from ..trace.importers import import_warp_jsonl

            tr, report = import_warp_jsonl(list(sources), **shape, skip_bad_rows=skip_bad_rows,
                                           category_from=category_from, provenance=prov)
        else:
            from ..trace.importers import import_columnar

            tr, report = import_columnar(list(sources), mapping=mapping, **shape, phase=phase,
                                         category_from=category_from, skip_bad_rows=skip_bad_rows, provenance=prov)
        tr.save(out, overwrite=overwrite)
    caveat = shape_caveat(tr.provenance, tr.n_experts)
    if as_json:
        _echo_json({"out": out, "n_requests": tr.n_requests, "n_tokens": tr.n_tokens,
                    "n_experts_caveat": caveat, "report": report.to_dict() if report else None})
        return
    click.echo(f"wrote {out}: {tr.n_requests} requests, {tr.n_tokens} tokens, "
               f"L={tr.n_layers} N={tr.n_experts} k={tr.top_k}")
    if report is not None:
        inferred = ", ".join(report.inferred) or "nothing"
        click.echo(f"inferred: {inferred}" + (" (N = max id + 1 is a lower bound; pass --experts)"
                                             if report.n_experts_is_lower_bound else ""))
        if report.reading:
            click.echo(f"reading: {report.reading}")
        click.echo(f"dropped: {report.n_incomplete_steps} incomplete steps, {report.n_bad_rows} bad rows; "
                   f"{report.n_position_gaps} requests with position gaps")
        if report.n_gap_tokens:
            shown = ", ".join(f"({r!r}, {p})" for r, p in report.gaps[:5])
            click.echo(f"gaps: {report.n_gap_tokens} interior token(s) missing a layer (request, position): {shown}"
                       + (", ..." if report.n_gap_tokens > 5 else ""))
        if report.categories_from:
            cats = sorted(set(tr.provenance.get("categories", {}).values()))
            click.echo(f"categories (from {report.categories_from}): {', '.join(cats[:10])}"
                       + (", ..." if len(cats) > 10 else ""))
        for line in (*report.gap_examples, *report.incomplete_examples, *report.bad_row_examples, *report.notes):
            click.echo(f"  {line}")
    elif category_from:
        click.echo(f"categories (from {category_from}): "
                   f"{', '.join(sorted(set(tr.provenance.get('categories', {}).values())))}")


@trace.command("info")
@click.argument("trace_dir", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object (the whole provenance included).")
@click.option("--full", is_flag=True, help="Print the whole provenance (indented JSON) instead of a one-line summary.")
@_guard
def trace_info(trace_dir: str, as_json: bool, full: bool) -> None:
    """Validate TRACE_DIR and summarise it (with the caveat when N was inferred from the data)."""
    from ..trace import DECODE, read_trace
    from ..trace.provenance import provenance_summary, shape_caveat

    tr = read_trace(trace_dir)
    caveat = shape_caveat(tr.provenance, tr.n_experts)
    info = {"n_layers": tr.n_layers, "n_experts": tr.n_experts, "n_experts_caveat": caveat, "top_k": tr.top_k,
            "n_requests": tr.n_requests, "n_tokens": tr.n_tokens, "n_decode_tokens": int((tr.phase == DECODE).sum()),
            "has_gates": tr.gates is not None, "has_token_ids": bool((tr.token_id >= 0).any()),
            "provenance": tr.provenance}
    if as_json:
        _echo_json(info)
        return
    for key, value in info.items():
        if key == "n_experts_caveat":
            if value:
                click.echo(f"{'':16s} ({value})")
            continue
        if key == "provenance":
            value = json.dumps(value, indent=2, sort_keys=True, default=str) if full else \
                provenance_summary(value) + " (--full or --json for all)"
        click.echo(f"{key:16s} {value}")


@trace.command("examples")
@click.option("--path", "name", default=None, metavar="NAME", help="Print only the path of bundled example NAME.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per example (name, kind, path, caption).")
@_guard
def trace_examples(name: str | None, as_json: bool) -> None:
    """List the bundled examples (traces, prompts, labels, foreign-format files) with their paths.

    `expertcache trace examples --path example_model_trace` prints one path, for use in a shell:
    `expertcache events build "$(expertcache trace examples --path example_model_trace)" -B 8 -o stream`.
    """
    from .. import examples

    keys = examples.names() if name is None else (examples.describe(name.replace("-", "_")).name,)  # warp-olmoe
    if name is not None and not as_json:
        click.echo(str(examples.path(keys[0])))
        return
    for key in keys:
        ex = examples.describe(key)
        if as_json:
            _echo_json({"name": key, "kind": ex.kind, "path": str(examples.path(key)), "caption": ex.caption})
            continue
        how = f"  (trace import --format {ex.kind})" if ex.kind in ("warp-jsonl",) else ""
        click.echo(f"{key:24s} {ex.kind:13s} {examples.path(key)}{how}\n    {ex.caption}")


# ---------------------------------------------------------------------------- events
