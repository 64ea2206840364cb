"""DeepSeek-style CSV files, one per text: ``Layer ID,Batch Number,Token,Activated Expert IDs``.

This is the layout of the MoE-Beyond activation logs of DeepSeek-V2-Lite(-Chat): the producing script
tokenises one text, runs **one forward pass** over it with a hook on every MoE layer's
``mlp.gate``, and writes, layer by layer, one row per (batch row, token) of that forward:
``layer_idx, b, token_text, topk_ids``. So:

* ``Batch Number`` is the row ``b`` of that forward's batch (always 0 in the published files), not a
  generation step; rows with ``b > 0`` are other texts and become separate requests (``NAME/b``).
* Inside a (batch row, layer) group rows come in token order: the i-th row of every layer of a
  batch row is token ``i``.
* Nothing was generated: the tokens are a teacher-forced sequence. They are imported as **decode
  positions** of one request per file (replaying them means each token's routing equals its
  routing when decoded one at a time with the same prefix, up to numerics); ``phase="prefill"``
  marks them as prompt instead.
"""

from __future__ import annotations

import csv
import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ValidationError
from ..model import RoutingTrace
from ._common import (
    MAX_FIELD_BYTES,
    ImportReport,
    Records,
    RowBuffer,
    _check_shape_args,
    _expert_ids,
    _short,
    assemble,
    concat_records,
    file_list,
    phase_code,
)

__all__ = ["import_deepseek_csv", "READING_DECODE", "READING_PREFILL"]

_DEEPSEEK_COLUMNS = ("Layer ID", "Batch Number", "Token", "Activated Expert IDs")
_SPLIT = re.compile(r"[\s,]+")
#: What an imported DeepSeek CSV token means (recorded in the report and the provenance).
READING_DECODE = ("teacher-forced over the prompt; no generation: each file is one forward pass over one text "
                  "(hooked at mlp.gate), imported as the decode positions of one request per file and batch "
                  "row; replaying it means each token's routing equals its routing when decoded one at a time "
                  "with the same prefix, up to numerics")
READING_PREFILL = ("teacher-forced over the prompt; no generation: each file is one forward pass over one text "
                   "(hooked at mlp.gate), imported as prefill (--phase prefill), so the trace has no decode "
                   "tokens to schedule")


def _parse_expert_list(text: str) -> tuple[int, ...] | str:
    """``"[3, 17, 42]"``, ``"3 17 42"`` or ``"3,17,42"`` -> ``(3, 17, 42)``; an error message otherwise."""
    body = text.strip()
    if body.startswith("[") and body.endswith("]") or body.startswith("(") and body.endswith(")"):
        body = body[1:-1]
    parts = [p for p in _SPLIT.split(body.strip()) if p]
    if not parts:
        return f"expected a list of expert ids like '[3, 17, 42]' or '3 17 42'; got {text!r:.60}"
    if any(len(p) > 12 or not p.lstrip("-").isdigit() for p in parts):
        return f"expected integer expert ids like '[3, 17, 42]' or '3 17 42'; got {text!r:.60}"
    return _expert_ids([int(p) for p in parts])


def import_deepseek_csv(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    n_layers: int | None = None,
    n_experts: int | None = None,
    top_k: int | None = None,
    phase: str = "decode",
    skip_bad_rows: bool = False,
    category_from: str | None = None,
    provenance: dict[str, Any] | None = None,
) -> tuple[RoutingTrace, ImportReport]:
    """Read per-text CSV files ``Layer ID,Batch Number,Token,Activated Expert IDs`` (DeepSeek-V2-Lite).

    Parameters
    ----------
    paths
        CSV files (one per text; the request id is the file name without ``.csv``, with ``/b``
        appended for batch rows ``b > 0``), or a directory whose ``*.csv`` files are read in name order.
    n_layers, n_experts, top_k
        The model's shape; each one left ``None`` is inferred and named in the report.
    phase
        ``"decode"`` (default: the teacher-forced tokens are decode positions) or ``"prefill"``.
    skip_bad_rows
        Count and skip unreadable rows instead of raising.
    category_from
        ``"file"`` (the file's name) or the name of an extra column holding each text's category.
    provenance
        Extra metadata for the trace manifest.

    Notes
    -----
    Token ``i`` of a batch row is the ``i``-th row of each ``(batch row, layer)`` group. A layer
    that lists other tokens than the other layers of its batch row (not merely fewer) cannot be
    aligned: its rows are left out, so those tokens are reported incomplete and dropped.
    ``Token`` becomes the token id only when every value of the file is an integer; otherwise ids
    are unknown (-1).
    """
    _check_shape_args(n_layers, n_experts, top_k)
    pcode = phase_code(phase)
    files = file_list(paths, ["*.csv"])
    stems: dict[str, str] = {}
    parts: list[Records] = []
    unaligned: list[np.ndarray] = []
    notes: list[str] = []
    n_text_files = 0
    n_multi = 0
    for f in files:
        if f.stem in stems:
            raise ValidationError(f"two files give the same request id {f.stem!r} (also {stems[f.stem]}); "
                                  "rename one", source=str(f))
        stems[f.stem] = str(f)
        recs, drop, text_tokens, multi = _read_file(f, pcode, category_from, notes)
        parts.append(recs)
        unaligned.append(drop)
        n_text_files += text_tokens
        n_multi += multi
    if n_text_files:
        notes.append(f"{n_text_files} file(s) hold token text, not integer ids: token ids unknown (-1)")
    if n_multi:
        notes.append(f"{n_multi} file(s) hold several batch rows: each batch row b > 0 is its own request NAME/b")
    recs = concat_records(parts)
    reading = READING_DECODE if phase == "decode" else READING_PREFILL
    return assemble(recs, fmt="deepseek-csv", n_layers=n_layers, n_experts=n_experts, top_k=top_k,
                    skip_bad_rows=skip_bad_rows, provenance=provenance, notes=notes, reading=reading,
                    categories_from=category_from, drop_unaligned=np.concatenate(unaligned))


def _read_file(path: Path, pcode: int, category_from: str | None, notes: list[str]
               ) -> tuple[Records, np.ndarray, int, int]:
    """One CSV -> its records, the rows that cannot be aligned, whether tokens are text, whether it has b > 0."""
    src = str(path)
    try:
        handle = open(path, encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise ValidationError(f"cannot open ({exc.strerror})", source=src) from None
    buf = RowBuffer(src, fields={"layer": "Layer ID", "experts": "Activated Expert IDs"})
    tokens: list[str] = []
    groups: dict[tuple[str, int], list[int]] = {}  # (request, layer) -> record indices in row order
    cat_idx = None
    stem = path.stem
    with handle:
        reader = csv.reader(handle)
        try:
            header = next(reader, None)
            if header is None:
                raise ValidationError(f"empty file; expected the header {','.join(_DEEPSEEK_COLUMNS)}", source=src)
            names = [h.strip().lower() for h in header]
            try:
                idx = [names.index(c.lower()) for c in _DEEPSEEK_COLUMNS]
            except ValueError:
                raise ValidationError(f"expected the header {','.join(_DEEPSEEK_COLUMNS)}; got "
                                      f"{','.join(header)[:200]}", source=src, record=1) from None
            if category_from not in (None, "file"):
                if category_from.lower() not in names:
                    raise ValidationError(f"no column {category_from!r} (--category-from); columns: "
                                          f"{','.join(header)[:200]}", source=src, record=1)
                cat_idx = names.index(category_from.lower())
            for row in reader:
                line = reader.line_num
                if not any(cell.strip() for cell in row):
                    continue
                if len(row) < len(header):
                    buf.bad(line, f"expected {len(header)} columns; got {len(row)}", None)
                    tokens.append("")
                    continue
                li, bi, ti, ei = (row[j] for j in idx)
                layer = _nonneg(li)
                if layer is None:
                    buf.bad(line, f"expected a non-negative integer; got {li!r:.60}", "Layer ID")
                    tokens.append("")
                    continue
                batch = _nonneg(bi)
                if batch is None:
                    buf.bad(line, f"expected a non-negative integer; got {bi!r:.60}", "Batch Number")
                    tokens.append("")
                    continue
                ex = _parse_expert_list(ei)
                if isinstance(ex, str):
                    buf.bad(line, ex, "Activated Expert IDs")
                    tokens.append("")
                    continue
                rid = stem if batch == 0 else f"{stem}/{batch}"
                cat = stem if category_from == "file" else (row[cat_idx] if cat_idx is not None else None)
                groups.setdefault((rid, layer), []).append(len(buf.req))
                tokens.append(ti)
                buf.add(line, rid, None, layer, ex, None, pcode, -1, cat)
        except UnicodeDecodeError:
            raise ValidationError("not UTF-8 text; expected CSV", source=src) from None
        except csv.Error as exc:
            msg = str(exc)
            if "field larger than field limit" in msg:
                msg = (f"a field over {MAX_FIELD_BYTES // 1024} KiB: no routing field is that long (an unclosed "
                       "quote?); is this the right file?")
            else:
                msg = f"malformed CSV ({msg})"
            raise ValidationError(msg, source=src, record=reader.line_num) from None
    recs = buf.records()
    good = [i for i in range(len(tokens)) if i not in buf.bad_messages]
    tokens_are_ids = bool(good) and all(re.fullmatch(r"\s*\d{1,18}\s*", tokens[i]) for i in good)
    if tokens_are_ids:
        tok = np.full(recs.n, -1, np.int64)
        tok[good] = [int(tokens[i]) for i in good]
        recs.token_id = tok
    # A layer listing other tokens than the others of its request (not merely fewer) cannot be aligned.
    drop = np.zeros(recs.n, bool)
    by_req: dict[str, dict[int, list[int]]] = {}
    for (rid, layer), rows in groups.items():
        by_req.setdefault(rid, {})[layer] = rows
    for rid, layers in by_req.items():
        seqs = {layer: tuple(tokens[i] for i in rows) for layer, rows in layers.items()}
        width = max(len(s) for s in seqs.values())
        ref = Counter(s for s in seqs.values() if len(s) == width).most_common(1)[0][0]
        bad_layers = sorted(layer for layer, s in seqs.items() if s != ref[:len(s)])
        if bad_layers:
            for layer in bad_layers:
                drop[layers[layer]] = True
            notes.append(f"{path.name}: request {rid!r}: layer(s) {_short(bad_layers)} list other tokens than the "
                         f"other layers; their rows cannot be aligned to positions and are left out")
    multi = int(any(r != stem for r in recs.request_names))
    return recs, drop, int(bool(good) and not tokens_are_ids), multi


def _nonneg(text: str) -> int | None:
    t = text.strip()
    if not t.isdigit() or len(t) > 9:
        return None
    return int(t)
