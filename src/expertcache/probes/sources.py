"""Payload sources of the probe-set builder: one local JSON Lines or CSV file per archetype (§3.4).

A record is ``{"id", "group", "payload"}`` plus optional ``"family"`` (source
family) and any other fields (kept in the manifest only as the file hash):

- ``id``: unique within the archetype (string or integer);
- ``group``: the source group; the discovery/confirmatory split never puts
  one group on both sides (several records of one document, module or
  table share a group);
- ``payload``: a non-empty string, or a JSON object of scalar fields (a
  structured record; styles render it field by field). CSV files carry text
  payloads only, in a ``payload`` column.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import ValidationError
from ..jsonl import iter_records

__all__ = ["Payload", "read_source", "read_sources", "discover_sources", "example_sources_dir", "payload_text"]

REQUIRED = ("id", "group", "payload")


@dataclass(frozen=True)
class Payload:
    """One source record of one archetype."""

    archetype: str
    id: str
    group: str
    payload: str | dict[str, Any]
    family: str
    record: int

    @property
    def text(self) -> str:
        """The payload as plain text (what the 5-gram filter compares)."""
        return payload_text(self.payload)


def payload_text(payload: str | dict[str, Any]) -> str:
    """A text payload itself; a record payload as ``key: value`` lines."""
    if isinstance(payload, dict):
        return "\n".join(f"{k}: {v}" for k, v in payload.items())
    return payload


def example_sources_dir() -> Path:
    """Directory of the bundled example payloads (Python standard library docstrings, PSF-2.0)."""
    return Path(str(resources.files("expertcache.probes") / "data" / "examples"))


def discover_sources(directory: str | os.PathLike[str]) -> dict[str, Path]:
    """``{archetype: file}`` for every ``*.jsonl`` / ``*.csv`` file of ``directory`` (archetype = file stem)."""
    d = Path(directory)
    if not d.is_dir():
        raise ValidationError("expected a directory of per-archetype payload files (NAME.jsonl or NAME.csv)",
                              source=str(d))
    found: dict[str, Path] = {}
    for p in sorted(d.iterdir()):
        if p.suffix.lower() in (".jsonl", ".csv") and p.is_file():
            if p.stem in found:
                raise ValidationError(f"two files for archetype {p.stem!r} ({found[p.stem].name}, {p.name})",
                                      source=str(d))
            found[p.stem] = p
    if not found:
        raise ValidationError("no NAME.jsonl or NAME.csv payload files found", source=str(d))
    return found


def read_source(archetype: str, path: str | os.PathLike[str]) -> tuple[Payload, ...]:
    """Read and check one archetype's payload file."""
    src = str(path)
    p = Path(path)
    if not p.is_file():
        raise ValidationError(f"payload file of archetype {archetype!r} not found", source=src)
    rows: list[tuple[int, dict[str, Any]]] = []
    if p.suffix.lower() == ".csv":
        try:
            with open(p, encoding="utf-8", newline="") as fh:
                reader = csv.DictReader(fh)
                names = reader.fieldnames or []
                missing = [f for f in REQUIRED if f not in names]
                if names and missing:
                    raise ValidationError(f"CSV header lacks column(s) {', '.join(missing)}; expected "
                                          f"{', '.join(REQUIRED)} (+ optional family)", source=src)
                rows = [(i, dict(r)) for i, r in enumerate(reader, start=2)]
        except UnicodeDecodeError:
            raise ValidationError("not UTF-8 text; expected CSV", source=src) from None
    else:
        rows = list(iter_records(p))
    if not rows:
        raise ValidationError(f"archetype {archetype!r} has no payload records (the file is empty); "
                              "add records {\"id\", \"group\", \"payload\"} or remove the file", source=src)
    out: list[Payload] = []
    seen: dict[str, int] = {}
    for rec_no, rec in rows:
        for name in REQUIRED:
            if rec.get(name) is None or (isinstance(rec[name], str) and not rec[name].strip()):
                raise ValidationError(f"archetype {archetype!r}: missing {name!r}; every record needs "
                                      f"{', '.join(REQUIRED)}", source=src, record=rec_no, field=name)
        rid, group, payload = rec["id"], rec["group"], rec["payload"]
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            raise ValidationError(f"expected a string or integer; got {rid!r}", source=src, record=rec_no, field="id")
        if not isinstance(group, (str, int)) or isinstance(group, bool):
            raise ValidationError(f"expected a string; got {group!r}", source=src, record=rec_no, field="group")
        if isinstance(payload, dict):
            if not payload or not all(isinstance(k, str) and (v is None or isinstance(v, (str, int, float, bool)))
                                      for k, v in payload.items()):
                raise ValidationError("a record payload must be a non-empty object of scalar fields",
                                      source=src, record=rec_no, field="payload")
        elif not isinstance(payload, str):
            raise ValidationError(f"expected a string or an object; got {type(payload).__name__}", source=src,
                                  record=rec_no, field="payload")
        rid = str(rid)
        if rid in seen:
            raise ValidationError(f"duplicate id {rid!r} (first at record {seen[rid]})", source=src, record=rec_no,
                                  field="id")
        seen[rid] = rec_no
        family = rec.get("family") or "default"
        out.append(Payload(archetype, rid, str(group), payload, str(family), rec_no))
    return tuple(out)


def read_sources(sources: dict[str, str | os.PathLike[str]]) -> dict[str, tuple[Payload, ...]]:
    """Read every archetype's file; archetype names must be non-empty and not contain ``/``."""
    if not sources:
        raise ValidationError("no payload sources given; pass --sources DIR or --source NAME=FILE")
    out = {}
    for name in sorted(sources):
        if not name or "/" in name or name.strip() != name:
            raise ValidationError(f"bad archetype name {name!r}; use a plain word such as 'document_rag'")
        out[name] = read_source(name, sources[name])
    return out


