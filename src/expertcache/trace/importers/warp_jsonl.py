"""warp JSON Lines: one decode step per line, ``{"tok": n, "layers": [[k ids] x L]}``.

This is what the ``tools/trace_hf.py`` script of the warp project writes: batch-1 generation with a
full re-forward per step (no KV cache) and a forward hook on every layer's ``mlp.gate`` that records
the top-k ids of the newest position. Per line: ``tok`` is the decode step, ``layers[i]`` the top-k
ids of MoE layer ``i``, **sorted** (rank order is lost); there are no gate values, no prompt tokens
and no token ids, and the script does not write step 0, so ``tok`` starts at 1.

One file is one request (its name without the extension); every line is a decode position.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from ...errors import ValidationError
from ..model import DECODE, RoutingTrace
from ._common import (
    MAX_POSITION,
    ImportReport,
    Records,
    RowBuffer,
    _check_shape_args,
    _expert_ids,
    assemble,
    concat_records,
    file_list,
    guarded_record,
)

__all__ = ["import_warp_jsonl", "READING"]

#: What an imported warp token means.
READING = ("batch-1 decode, one request per file: each line is one generated token's routing (sampled "
           "generation, full re-forward per step); ids sorted, so rank order is lost; no gates; the prompt and "
           "the first decode step (tok 0) are not in the file")


def import_warp_jsonl(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    n_layers: int | None = None,
    n_experts: int | None = None,
    top_k: int | None = None,
    skip_bad_rows: bool = False,
    category_from: str | None = None,
    provenance: dict[str, Any] | None = None,
    fast: bool = True,
) -> tuple[RoutingTrace, ImportReport]:
    """Read warp decode-step routing files (``{"tok": n, "layers": [[k ids] x L]}`` per line).

    Parameters
    ----------
    paths
        JSON Lines files, one request each (the file name without its extension), or a directory of
        ``*.jsonl``.
    n_layers, n_experts, top_k
        The model's shape; each one left ``None`` is inferred (``L`` from the lists per line, ``N``
        as max id + 1, a lower bound, ``k`` as the commonest list length) and named in the report.
    skip_bad_rows
        Count and skip unreadable lines instead of raising.
    category_from
        ``"file"``: each file's name is its request's category.
    provenance
        Extra metadata for the trace manifest.
    fast
        Parse with pyarrow where it can (``False``: line by line; the result is the same).
    """
    _check_shape_args(n_layers, n_experts, top_k)
    if category_from not in (None, "file"):
        raise ValidationError(f"warp files carry no category field; --category-from must be 'file'; got "
                              f"{category_from!r}", field="category_from")
    files = file_list(paths, ["*.jsonl"])
    seen: dict[str, Path] = {}
    parts: list[Records] = []
    n_rows = 0
    for f in files:
        if f.stem in seen:
            raise ValidationError(f"two files give the same request id {f.stem!r} (also {seen[f.stem]}); rename one",
                                  source=str(f))
        seen[f.stem] = f
        recs, rows = (_fast(f, category_from) if fast and not skip_bad_rows else (None, 0))
        if recs is None:
            recs, rows = _slow(f, category_from)
        parts.append(recs)
        n_rows += rows
    recs = concat_records(parts)
    notes = ["ids are sorted in the source: rank order (and so any gate) is unknown",
             "the producing script does not write decode step 0: tok starts at 1"]
    return assemble(recs, fmt="warp-jsonl", n_layers=n_layers, n_experts=n_experts, top_k=top_k,
                    skip_bad_rows=skip_bad_rows, provenance=provenance, notes=notes, n_rows=n_rows, reading=READING,
                    categories_from=category_from)


def _fast(p: Path, category_from: str | None) -> tuple[Records | None, int]:
    import pyarrow.json as pj

    from .columnar import Layout, _json_row_lines, table_records

    if p.stat().st_size == 0:
        return None, 0
    try:
        table = pj.read_json(p, read_options=pj.ReadOptions(block_size=16 << 20))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None, 0
    t = {name: table.schema.field(name).type for name in table.column_names}
    if not ("tok" in t and pa.types.is_int64(t["tok"]) and "layers" in t and pa.types.is_list(t["layers"])
            and pa.types.is_list(t["layers"].value_type) and pa.types.is_int64(t["layers"].value_type.value_type)):
        return None, 0
    if table["tok"].null_count or table["layers"].null_count:
        return None, 0
    if table["layers"].combine_chunks().flatten().null_count:
        return None, 0
    lay = Layout(request=None, request_value=p.stem, position="tok", layer=None, experts="layers", gates=None,
                 phase=None, token_id=None, category=None)
    recs = table_records(table, lay, str(p), _json_row_lines(p), DECODE,
                         p.stem if category_from == "file" else None)
    recs.fields["layer"] = "layers"
    return recs, table.num_rows


def _slow(p: Path, category_from: str | None) -> tuple[Records, int]:
    """Line by line: unreadable lines become placeholders that the bad-row policy raises or skips."""
    src = str(p)
    buf = RowBuffer(src, fields={"position": "tok", "experts": "layers", "layer": "layers"})
    cat = p.stem if category_from == "file" else None
    rows = 0
    try:
        handle = open(p, encoding="utf-8-sig")
    except OSError as exc:
        raise ValidationError(f"cannot open ({exc.strerror})", source=src) from None
    with handle:
        try:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                rows += 1
                try:  # the shared guards: nesting, 64-bit integers, lone surrogates (jsonl.json_object)
                    rec = guarded_record(line, src, line_no)
                except ValidationError as exc:
                    buf.bad(line_no, exc.detail, exc.field)
                    continue
                tok = rec.get("tok")
                if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok <= MAX_POSITION:
                    buf.bad(line_no, f"expected a non-negative integer decode step; got {tok!r:.60}", "tok")
                    continue
                layers = rec.get("layers")
                if not isinstance(layers, list) or not layers:
                    buf.bad(line_no, f"expected a list of expert-id lists, one per layer; got {layers!r:.60}",
                            "layers")
                    continue
                parsed = [_expert_ids(x) for x in layers]
                bad = next((m for m in parsed if isinstance(m, str)), None)
                if bad is not None:
                    li = next(i for i, m in enumerate(parsed) if isinstance(m, str))
                    buf.bad(line_no, f"layer {li}: {bad}", "layers")
                    continue
                for li, ex in enumerate(parsed):
                    buf.add(line_no, p.stem, tok, li, ex, None, DECODE, -1, cat)  # type: ignore[arg-type]
        except UnicodeDecodeError:
            raise ValidationError("not UTF-8 text; expected JSON Lines", source=src) from None
    if not rows:
        raise ValidationError("empty file; expected one JSON object per decode step", source=src)
    return buf.records(), rows
