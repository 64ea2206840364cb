"""JSON Lines interchange (docs/design.md §3): record iteration and field checks with precise errors.

Every error names the file, the 1-based line (record) and the field.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from .errors import ValidationError

__all__ = ["iter_records", "check_shape", "json_object", "int_field", "int_list", "float_list"]


def check_shape(n_layers: int, n_experts: int, top_k: int) -> None:
    """Check the ``--layers/--experts/--top-k`` arguments of an import."""
    from .storage import MAX_BLOCKS, MAX_EXPERTS, MAX_LAYERS

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


def iter_records(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, record)`` for every non-blank line of a JSON Lines file."""
    src = str(path)
    try:
        handle = open(path, encoding="utf-8")
    except OSError as exc:
        raise ValidationError(f"cannot open ({exc.strerror})", source=src) from None
    with handle:
        try:
            for line_no, line in enumerate(handle, start=1):
                if line.strip():
                    yield line_no, json_object(line, src, line_no)
        except UnicodeDecodeError:
            raise ValidationError("not UTF-8 text; expected JSON Lines", source=src) from None


def json_object(line: str, src: str, line_no: int) -> dict[str, Any]:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"not valid JSON ({exc.msg}); the line may be truncated", source=src,
                              record=line_no) from None
    if not isinstance(rec, dict):
        raise ValidationError(f"expected a JSON object; got {type(rec).__name__}", source=src, record=line_no)
    return rec


def int_field(rec: dict[str, Any], name: str, src: str, line_no: int, lo: int, hi: int | None = None) -> int:
    value = rec.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"expected an integer; got {value!r}", source=src, record=line_no, field=name)
    if value < lo or (hi is not None and value >= hi):
        rng = f"[{lo}, {hi})" if hi is not None else f">= {lo}"
        raise ValidationError(f"must be {rng}; got {value}", source=src, record=line_no, field=name)
    return value


def int_list(rec: dict[str, Any], name: str, src: str, line_no: int, k: int | None, n: int) -> np.ndarray:
    value = rec.get(name)
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise ValidationError(f"expected a list of integers; got {value!r}", source=src, record=line_no, field=name)
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
            raise ValidationError(f"expected finite numbers; got {v!r}", source=src, record=line_no, field=name)
        out.append(v)
    return np.array(out, dtype=np.float32)
