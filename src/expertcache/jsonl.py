"""JSON Lines interchange (docs/design.md §3): record iteration and field checks with precise errors.

Every error names the file, the 1-based line (record) and the field.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from .errors import ValidationError

__all__ = ["iter_records", "check_shape", "json_object", "int_field", "int_list", "float_list"]


#: Bounds on a model's shape (docs/safety.md): expert ids are stored as int16, and replay keeps
#: per-block state for all ``L * N`` blocks, so a crafted manifest cannot make it allocate gigabytes.
MAX_LAYERS = 4096
MAX_EXPERTS = 32767
MAX_BLOCKS = 1 << 22


def _shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` clipped to ``limit`` characters (a hostile record can hold megabytes)."""
    text = repr(value) if not isinstance(value, (list, dict, str)) or len(value) < 1000 else \
        f"{type(value).__name__} of {len(value)} items"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_shape(n_layers: int, n_experts: int, top_k: int) -> None:
    """Check the ``--layers/--experts/--top-k`` arguments of an import."""
    for name, value, hi in (("--layers", n_layers, MAX_LAYERS), ("--experts", n_experts, MAX_EXPERTS),
                            ("--top-k", top_k, MAX_EXPERTS)):
        if value < 1:
            raise ValidationError(f"{name} must be a positive integer; got {value}")
        if value > hi:
            raise ValidationError(f"{name} must be at most {hi}; got {value}")
    if top_k > n_experts:
        raise ValidationError(f"--top-k must be <= --experts ({n_experts}); got {top_k}")
    if n_layers * n_experts > MAX_BLOCKS:
        raise ValidationError(f"--layers x --experts = {n_layers * n_experts:,} blocks exceeds the supported "
                              f"{MAX_BLOCKS:,}; check the model shape")


#: Longest JSON Lines record read (a line beyond it is refused before parsing).
MAX_LINE_BYTES = 64 << 20
#: Deepest nesting of arrays/objects in one record (this project's records nest two levels).
MAX_DEPTH = 64
#: Integers must fit the 64-bit fields they are stored in.
_INT64 = 2 ** 63
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def iter_records(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, record)`` for every non-blank line of a JSON Lines file.

    A UTF-8 byte-order mark is accepted. Every error is one :class:`ValidationError` naming the file
    and line: invalid JSON, a record that is not an object, nesting deeper than :data:`MAX_DEPTH`,
    integers outside the 64-bit range (or longer than Python parses), lone UTF-16 surrogates, lines
    over :data:`MAX_LINE_BYTES`.
    """
    src = str(path)
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise ValidationError(f"cannot open ({exc.strerror})", source=src) from None
    with handle:
        line_no = 0
        while True:
            raw = handle.readline(MAX_LINE_BYTES + 1)
            if not raw:
                break
            line_no += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise ValidationError(f"line longer than {MAX_LINE_BYTES:,} bytes; expected one JSON record per "
                                      "line", source=src, record=line_no)
            if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ValidationError("not UTF-8 text; expected JSON Lines", source=src, record=line_no) from None
            if line.strip():
                yield line_no, json_object(line, src, line_no)


def _parse_int(text: str) -> int:
    if len(text) > 20:
        raise _TooLarge(text)
    value = int(text)
    if not -_INT64 <= value < _INT64:
        raise _TooLarge(text)
    return value


class _TooLarge(ValueError):
    pass


def _depth(obj: Any, limit: int) -> bool:
    """Whether ``obj`` nests deeper than ``limit`` (iterative: no recursion on hostile input)."""
    stack = [(obj, 0)]
    while stack:
        cur, d = stack.pop()
        if d > limit:
            return True
        if isinstance(cur, dict):
            stack.extend((v, d + 1) for v in cur.values())
        elif isinstance(cur, list):
            stack.extend((v, d + 1) for v in cur)
    return False


def json_object(line: str, src: str, line_no: int) -> dict[str, Any]:
    """Parse one JSON Lines record into a dict, or raise one :class:`ValidationError` naming the line."""
    opened = line.count("[") + line.count("{")
    try:
        rec = json.loads(line, parse_int=_parse_int)
    except _TooLarge as exc:
        text = str(exc)
        shown = text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"
        raise ValidationError(f"integer {shown} is outside the 64-bit range the formats store", source=src,
                              record=line_no) from None
    except RecursionError:
        raise ValidationError(f"nesting deeper than {MAX_DEPTH} levels; expected a flat JSON object",
                              source=src, record=line_no) from None
    except json.JSONDecodeError as exc:
        raise ValidationError(f"not valid JSON ({exc.msg}); the line may be truncated", source=src,
                              record=line_no) from None
    except ValueError as exc:
        raise ValidationError(f"not valid JSON ({exc})", source=src, record=line_no) from None
    if not isinstance(rec, dict):
        raise ValidationError(f"expected a JSON object; got {type(rec).__name__}", source=src, record=line_no)
    if opened > MAX_DEPTH and _depth(rec, MAX_DEPTH):
        raise ValidationError(f"nesting deeper than {MAX_DEPTH} levels; expected a flat JSON object",
                              source=src, record=line_no)
    if _SURROGATE.search(line):
        try:
            json.dumps(rec, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValidationError("a string holds a lone UTF-16 surrogate (\\ud800-\\udfff without its pair); "
                                  "it cannot be stored as UTF-8", source=src, record=line_no) from None
    return rec


#: Exclusive upper bounds of the stored types of integer fields (Parquet int32 positions, ...), applied
#: when a caller gives no bound of its own: a value that would not fit is an error, never a wrap-around.
STORED_BOUNDS = {"position": 2 ** 31, "layer": 2 ** 15, "active": 2 ** 31 - 1, "step": 2 ** 62,
                 "token_id": 2 ** 63, "batch": 2 ** 31}


def int_field(rec: dict[str, Any], name: str, src: str, line_no: int, lo: int, hi: int | None = None) -> int:
    """The integer field ``name`` of ``rec``, in ``[lo, hi)`` (``hi`` defaults to its stored bound)."""
    given = hi is not None
    if hi is None:
        hi = STORED_BOUNDS.get(name, _INT64)
    value = rec.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"expected an integer; got {_shown(value)}", source=src, record=line_no, field=name)
    if value < lo or (hi is not None and value >= hi):
        rng = f">= {lo}" if value < lo and not given else f"[{lo}, {hi})"
        raise ValidationError(f"must be {rng}; got {value}", source=src, record=line_no, field=name)
    return value


def int_list(rec: dict[str, Any], name: str, src: str, line_no: int, k: int | None, n: int) -> np.ndarray:
    value = rec.get(name)
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise ValidationError(f"expected a list of integers; got {_shown(value)}", source=src, record=line_no, field=name)
    if k is not None and len(value) != k:
        raise ValidationError(f"expected {k} expert ids (top_k); got {len(value)}", source=src,
                              record=line_no, field=name)
    if not value:
        raise ValidationError("expected at least one expert id", source=src, record=line_no, field=name)
    bad = [v for v in value if v < 0 or v >= n]
    if bad:
        raise ValidationError(f"expert id must be in [0, {n}); got {bad[0]}", source=src, record=line_no, field=name)
    if len(set(value)) != len(value):
        raise ValidationError("expert ids must be distinct", source=src, record=line_no, field=name)
    return np.array(value, dtype=np.int16)


def float_list(value: Any, src: str, line_no: int, k: int, name: str = "gates") -> np.ndarray:
    if not isinstance(value, list) or len(value) != k:
        raise ValidationError(f"expected a list of {k} numbers", source=src, record=line_no, field=name)
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValidationError(f"expected finite numbers; got {_shown(v)}", source=src, record=line_no, field=name)
        out.append(v)
    return np.array(out, dtype=np.float32)


#: Largest JSON document (a model file, a manifest) read whole.
MAX_DOCUMENT_BYTES = 64 << 20


def _read_document(path: str | os.PathLike[str], src: str, what: str) -> str:
    """A small UTF-8 document's text: at most :data:`MAX_DOCUMENT_BYTES`, a byte-order mark dropped."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as exc:
        raise ValidationError(f"cannot read {what} ({exc.strerror or exc})", source=src) from None
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise ValidationError(f"larger than {MAX_DOCUMENT_BYTES:,} bytes; expected {what}", source=src)
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValidationError(f"not UTF-8 text; expected {what}", source=src) from None
    return text


def read_json(path: str | os.PathLike[str], what: str = "a JSON document") -> Any:
    """Read one JSON document with the same guards as :func:`json_object` (size, nesting, integers).

    Raises
    ------
    ValidationError
        One line naming the file: missing, over :data:`MAX_DOCUMENT_BYTES`, not UTF-8, not valid JSON,
        nested deeper than :data:`MAX_DEPTH`, or holding an integer outside the 64-bit range.
    """
    src = str(path)
    text = _read_document(path, src, what)
    try:
        obj = json.loads(text, parse_int=_parse_int)
    except _TooLarge:
        raise ValidationError("holds an integer outside the 64-bit range", source=src) from None
    except RecursionError:
        raise ValidationError(f"nesting deeper than {MAX_DEPTH} levels; expected {what}", source=src) from None
    except ValueError as exc:
        raise ValidationError(f"not valid JSON ({getattr(exc, 'msg', exc)}); expected {what}", source=src) from None
    if _depth(obj, MAX_DEPTH):
        raise ValidationError(f"nesting deeper than {MAX_DEPTH} levels; expected {what}", source=src)
    return obj


def read_toml(path: str | os.PathLike[str], what: str = "a TOML file") -> dict[str, Any]:
    """Read a TOML document with the guards of :func:`read_json` (size, BOM, nesting, 64-bit integers).

    Raises
    ------
    ValidationError
        One line naming the file (and the key, for an integer out of range).
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    src = str(path)
    text = _read_document(path, src, what)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValidationError(f"not valid TOML ({exc})", source=src) from None
    except RecursionError:
        raise ValidationError(f"nesting deeper than {MAX_DEPTH} levels; expected {what}", source=src) from None
    except ValueError as exc:                      # e.g. an integer longer than Python converts
        raise ValidationError(f"not valid TOML ({str(exc)[:120]})", source=src) from None
    if _depth(data, MAX_DEPTH):
        raise ValidationError(f"nesting deeper than {MAX_DEPTH} levels; expected {what}", source=src)
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        cur, where = stack.pop()
        if isinstance(cur, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k)) for k, v in cur.items())
        elif isinstance(cur, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(cur))
        elif isinstance(cur, int) and not isinstance(cur, bool) and not -_INT64 <= cur < _INT64:
            raise ValidationError("integer outside the 64-bit range TOML allows", source=src, field=where)
    return data
