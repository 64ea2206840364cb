"""What a trace's provenance says about its own shape: the caveats every printed capacity must carry.

An importer that infers ``N`` as ``max expert id + 1`` records that in the trace's provenance
(``provenance["import"]["n_experts_is_lower_bound"]``); an event stream built from the trace keeps the trace's
provenance under ``"trace_provenance"``. Experts that were never selected are invisible to such an inference,
so the true ``N`` may be larger, every capacity ``rho * L * N`` derived from it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["import_record", "n_experts_is_lower_bound", "shape_caveat", "provenance_summary"]


def import_record(provenance: Mapping[str, Any]) -> Mapping[str, Any]:
    """The importer's record of a trace's or a stream's provenance (``{}`` when the data were not imported)."""
    for prov in (provenance, provenance.get("trace_provenance") or {}):
        record = prov.get("import") if isinstance(prov, Mapping) else None
        if isinstance(record, Mapping):
            return record
    return {}


def n_experts_is_lower_bound(provenance: Mapping[str, Any]) -> bool:
    """Whether ``N`` was inferred from the data (``max id + 1``), so that the true ``N`` may be larger."""
    return bool(import_record(provenance).get("n_experts_is_lower_bound", False))


def shape_caveat(provenance: Mapping[str, Any], n_experts: int) -> str | None:
    """The caveat to print beside ``N`` and every capacity derived from it, or ``None`` when ``N`` is known.

    >>> shape_caveat({"import": {"n_experts_is_lower_bound": True}}, 32)
    'N = 32 is inferred (max expert id + 1): a lower bound, so capacities derived from it may be too small'
    >>> shape_caveat({"trace_provenance": {"import": {"n_experts_is_lower_bound": False}}}, 32) is None
    True
    """
    if not n_experts_is_lower_bound(provenance):
        return None
    return (f"N = {n_experts} is inferred (max expert id + 1): a lower bound, so capacities derived from it "
            "may be too small")


def provenance_summary(provenance: Mapping[str, Any], width: int = 400) -> str:
    """One short line for a provenance dict: scalars as ``key=value`` (long ones cut), containers as their size.

    At most about ``width`` characters; what does not fit is counted (``+N more``). The whole
    dict is what ``--full`` or ``--json`` print.

    >>> provenance_summary({"model": "m", "requests": {"a": 1, "b": 2}, "shards": [1, 2, 3]})
    '3 keys: model=m, requests={2 entries}, shards=[3 items]'
    """
    def short(value: Any) -> str:
        if isinstance(value, Mapping):
            return f"{{{len(value)} entries}}"
        if isinstance(value, (list, tuple)):
            return f"[{len(value)} items]"
        text = str(value)
        return text if len(text) <= 40 else text[:37] + "..."

    keys = sorted(provenance, key=lambda k: (isinstance(provenance[k], (Mapping, list, tuple)), str(k)))
    parts: list[str] = []
    used = 0
    for key in keys:
        part = f"{key}={short(provenance[key])}"
        if used + len(part) > width and parts:
            break
        parts.append(part)
        used += len(part) + 2
    rest = len(keys) - len(parts)
    return f"{len(keys)} keys: " + ", ".join(parts) + (f", +{rest} more" if rest else "")
