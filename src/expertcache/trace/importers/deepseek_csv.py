"""DeepSeek-style CSV files, one per prompt: ``Layer ID,Batch Number,Token,Activated Expert IDs``."""

from __future__ import annotations

import csv
import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...errors import ValidationError
from ..model import DECODE, PREFILL, RoutingTrace
from ._common import ImportReport, _check_shape_args, _Collector, _expert_ids, _Row, _short

__all__ = ["import_deepseek_csv"]

_DEEPSEEK_COLUMNS = ("Layer ID", "Batch Number", "Token", "Activated Expert IDs")
_SPLIT = re.compile(r"[\s,]+")


def _parse_expert_list(text: str) -> tuple[int, ...] | str:
    """``"[3, 17, 42]"``, ``"3 17 42"`` or ``"3,17,42"`` -> ``(3, 17, 42)``; an error message otherwise."""
    body = text.strip()
    if body.startswith("[") and body.endswith("]") or body.startswith("(") and body.endswith(")"):
        body = body[1:-1]
    parts = [p for p in _SPLIT.split(body.strip()) if p]
    if not parts:
        return f"expected a list of expert ids like '[3, 17, 42]' or '3 17 42'; got {text!r:.60}"
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        return f"expected integer expert ids like '[3, 17, 42]' or '3 17 42'; got {text!r:.60}"
    return _expert_ids(ids)


def import_deepseek_csv(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    n_layers: int | None = None,
    n_experts: int | None = None,
    top_k: int | None = None,
    prefill_batches: int = 1,
    skip_bad_rows: bool = False,
    provenance: dict[str, Any] | None = None,
) -> tuple[RoutingTrace, ImportReport]:
    """Read per-prompt CSV files ``Layer ID,Batch Number,Token,Activated Expert IDs`` (DeepSeek-V2-Lite).

    Parameters
    ----------
    paths
        CSV files (one per prompt; the request id is the file name without ``.csv``), or a
        directory whose ``*.csv`` files are read in sorted name order.
    n_layers, n_experts, top_k
        The model's shape; each one left ``None`` is inferred and named in the report.
    prefill_batches
        How many leading batch numbers of each file are the prompt (prefill); later
        batches are decode steps. 0 imports everything as decode.
    skip_bad_rows
        Count and skip unreadable rows instead of raising.
    provenance
        Extra metadata for the trace manifest.

    Notes
    -----
    Token ``i`` of batch ``b`` is the ``i``-th row of each ``(b, layer)`` group. A
    layer that lists fewer tokens in a batch than the others leaves the batch's
    tokens unalignable beyond that count: those steps are reported as incomplete
    and dropped. ``Token`` becomes the token id only when every value of the file
    is an integer; otherwise ids are unknown (-1).
    """
    _check_shape_args(n_layers, n_experts, top_k)
    if isinstance(prefill_batches, bool) or not isinstance(prefill_batches, int) or prefill_batches < 0:
        raise ValidationError(f"must be a non-negative integer; got {prefill_batches!r}", field="prefill_batches")
    files = _csv_files(paths)
    col = _Collector("deepseek-csv", [str(f) for f in files], skip_bad_rows)
    stems: dict[str, str] = {}
    n_text_files = 0
    for f in files:
        rid = f.stem
        if rid in stems:
            raise ValidationError(f"two files give the same request id {rid!r} (also {stems[rid]}); "
                                  "rename one", source=str(f))
        stems[rid] = str(f)
        text_tokens = _read_deepseek_file(f, rid, col, prefill_batches)
        n_text_files += text_tokens
    if n_text_files:
        col.notes.append(f"{n_text_files} file(s) hold token text, not integer ids: token ids unknown (-1)")
    col.notes.append(f"'Batch Number' read as the generation's forward pass: the first {prefill_batches} "
                     "batch(es) of each file are prefill, later ones decode (--prefill-batches)")
    return col.build(n_layers, n_experts, top_k, provenance)


def _csv_files(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(p.glob("*.csv"))
            if not found:
                raise ValidationError("directory holds no *.csv files", source=str(p))
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise ValidationError("no such file or directory", source=str(p))
    if not files:
        raise ValidationError("no CSV files given")
    return files


def _read_deepseek_file(path: Path, rid: str, col: _Collector, prefill_batches: int) -> int:
    """Parse one per-prompt CSV into ``col.rows``; return 1 if its Token column holds text."""
    src = str(path)
    try:
        handle = open(path, encoding="utf-8", newline="")
    except OSError as exc:
        raise ValidationError(f"cannot open ({exc.strerror})", source=src) from None
    parsed: list[tuple[int, int, int, str, tuple[int, ...]]] = []  # (line, layer, batch, token, experts)
    with handle:
        try:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None:
                raise ValidationError(f"empty file; expected the header {','.join(_DEEPSEEK_COLUMNS)}", source=src)
            names = [h.strip().lower() for h in header]
            try:
                idx = [names.index(c.lower()) for c in _DEEPSEEK_COLUMNS]
            except ValueError:
                raise ValidationError(f"expected the header {','.join(_DEEPSEEK_COLUMNS)}; got {','.join(header)}",
                                      source=src, record=1) from None
            for row in reader:
                line = reader.line_num
                if not any(cell.strip() for cell in row):
                    continue
                col.n_rows += 1
                if len(row) < len(header):
                    col.bad(f"expected {len(header)} columns; got {len(row)}", src, line)
                    continue
                li, bi, ti, ei = (row[j] for j in idx)
                try:
                    layer = int(li)
                    if layer < 0:
                        raise ValueError
                except ValueError:
                    col.bad(f"expected a non-negative integer; got {li!r}", src, line, "Layer ID")
                    continue
                try:
                    batch = int(bi)
                    if batch < 0:
                        raise ValueError
                except ValueError:
                    col.bad(f"expected a non-negative integer; got {bi!r}", src, line, "Batch Number")
                    continue
                ex = _parse_expert_list(ei)
                if isinstance(ex, str):
                    col.bad(ex, src, line, "Activated Expert IDs")
                    continue
                parsed.append((line, layer, batch, ti, ex))
        except UnicodeDecodeError:
            raise ValidationError("not UTF-8 text; expected CSV", source=src) from None
        except csv.Error as exc:
            raise ValidationError(f"malformed CSV ({exc})", source=src) from None
    tokens_are_ids = bool(parsed) and all(re.fullmatch(r"\s*\d+\s*", p[3]) for p in parsed)
    batches = sorted({p[2] for p in parsed})
    if batches and batches[-1] - batches[0] + 1 != len(batches):
        col.gap_requests.add(rid)
    batch_rank = {b: i for i, b in enumerate(batches)}
    # Token i of a batch is the i-th row of each (batch, layer) group.
    tokens: dict[tuple[int, int], list[str]] = {}  # (batch, layer) -> token column, in row order
    for _line, layer, batch, tok, _ex in parsed:
        tokens.setdefault((batch, layer), []).append(tok)
    widths: dict[int, int] = {}
    for (batch, _layer), toks in tokens.items():
        widths[batch] = max(widths.get(batch, 0), len(toks))
    # A layer listing fewer tokens than the others (or other tokens) in a batch cannot be aligned to
    # positions: its rows of that batch are left out, so the batch's steps are reported incomplete.
    unaligned: set[tuple[int, int]] = set()
    for b in batches:
        groups = {layer: toks for (batch, layer), toks in tokens.items() if batch == b}
        ref = Counter(tuple(t) for t in groups.values() if len(t) == widths[b]).most_common(1)[0][0]
        bad_layers = sorted(layer for layer, toks in groups.items() if tuple(toks) != ref)
        if bad_layers:
            unaligned.update((b, layer) for layer in bad_layers)
            col.notes.append(f"{path.name}: batch {b}: layer(s) {_short(bad_layers)} list other tokens than the "
                             f"other layers ({widths[b]}); that batch's tokens cannot be aligned and are dropped")
    offsets: dict[int, int] = {}  # batch -> position of its first token
    start = 0
    for b in batches:
        offsets[b] = start
        start += widths[b]
    counter: dict[tuple[int, int], int] = {}  # (batch, layer) -> rows so far
    for line, layer, batch, tok, ex in parsed:
        i = counter.get((batch, layer), 0)
        counter[(batch, layer)] = i + 1
        if (batch, layer) in unaligned:
            continue
        pos = offsets[batch] + i
        phase = PREFILL if batch_rank[batch] < prefill_batches else DECODE
        token_id = int(tok) if tokens_are_ids else -1
        col.rows.append(_Row(rid, (batch, i), pos, phase, layer, ex, None, token_id, f"{src}:{line}"))
    return 0 if tokens_are_ids or not parsed else 1
