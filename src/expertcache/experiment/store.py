"""The result store: a tidy Parquet table, one row per condition and metric, written in atomic chunks.

Layout of a store directory::

    STORE/
      store.json            what was run last: spec name and sha256, condition count, complete or not
      parts/part-*.parquet  chunks written while a run progresses (each complete conditions only)
      results.parquet       the consolidated table of the last complete run, in condition order
      .lock                 held by the one run that may write

A chunk is written to a hidden temporary file and renamed into place, so a run
killed at any instant leaves only whole chunks behind; a re-run reads the
``(condition_id, condition_hash)`` pairs of every chunk and skips them. Rows
carry the condition's fields as columns, so DuckDB, pandas or polars can read
the table without this package.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import ValidationError
from ..storage import atomic_file, atomic_write_bytes, exclusive_lock, json_text, write_parquet
from .spec import CONDITION_FIELDS, PlannedCondition
from .tasks import METRICS

__all__ = ["ResultStore", "read_results", "RESULT_SCHEMA", "RESULTS_FILE"]

RESULTS_FILE = "results.parquet"
_META = "store.json"
_PARTS = "parts"
_KIND = "experiment_store"
_FORMAT = 1
#: What one row of a result table is (its Parquet metadata, docs/design.md §3).
RESULT_ROW = "one (condition, metric) of an experiment spec run: the condition's fields, the metric and its value"

_FIELD_TYPES = {
    "input": pa.string(), "selection": pa.string(), "order_seed": pa.int64(), "warm": pa.string(),
    "warm_requests": pa.int64(), "window_requests": pa.int64(), "discipline": pa.string(),
    "batch": pa.int64(), "admitted": pa.int64(), "window": pa.int64(), "scheduler": pa.string(),
    "offsets": pa.string(), "offsets_seed": pa.int64(), "policy": pa.string(), "rho": pa.float64(),
    "scope": pa.string(), "semantics": pa.string(), "tie_break": pa.string(), "tie_seed": pa.int64(),
    "lfu_in_cache_counters": pa.bool_(),
}
assert tuple(_FIELD_TYPES) == CONDITION_FIELDS

#: Columns of the tidy table.
RESULT_SCHEMA = pa.schema([("condition_id", pa.string()), ("condition_hash", pa.string()),
                           *((n, t) for n, t in _FIELD_TYPES.items()),
                           ("metric", pa.string()), ("value", pa.float64())])


def rows_to_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """Tidy rows (dicts with every column of :data:`RESULT_SCHEMA`) as an Arrow table."""
    return pa.Table.from_pylist(list(rows), schema=RESULT_SCHEMA)


@dataclass
class ResultStore:
    """A store directory (see the module docstring). Open with :meth:`open`."""

    path: Path

    @classmethod
    def open(cls, path: str | os.PathLike[str], create: bool = False) -> ResultStore:
        """Open ``path``; with ``create``, make it if missing. A foreign directory is refused."""
        p = Path(path)
        meta = p / _META
        if p.exists() and not p.is_dir():
            raise ValidationError("expected a result store directory; got a file", source=str(p))
        if meta.is_file():
            try:
                kind = json.loads(meta.read_text()).get("kind")
            except (ValueError, RecursionError, AttributeError, OSError):
                kind = None
            if kind != _KIND:
                raise ValidationError("store.json does not describe an expertcache result store",
                                      source=str(meta))
        elif p.is_dir() and any(x.name not in (_PARTS, ".lock") for x in p.iterdir()):
            raise ValidationError("directory exists and is not a result store (no store.json); choose a new or "
                                  "empty directory", source=str(p))
        elif not create:
            raise ValidationError("no result store here (run `expertcache spec run SPEC --store DIR` first)",
                                  source=str(p))
        (p / _PARTS).mkdir(parents=True, exist_ok=True)
        store = cls(p)
        if not meta.is_file():
            store.write_meta({"complete": False, "n_conditions": 0})
        return store

    # ------------------------------------------------------------------ locking
    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the store's write lock; a second concurrent run is refused with a clear error.

        :func:`expertcache.storage.exclusive_lock`: a POSIX lock on ``.lock`` that records the holder's
        pid and host, is not inherited by worker processes and is released by the OS when the holder
        ends, however it ends, so a killed run's lock is taken over by the next.
        """
        with exclusive_lock(self.path, "store"):
            yield

    # ------------------------------------------------------------------ metadata
    def read_meta(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / _META).read_text())
        except (OSError, ValueError, RecursionError):
            return {}

    def write_meta(self, meta: dict[str, Any]) -> None:
        """Replace ``store.json`` atomically."""
        body = {"kind": _KIND, "format": _FORMAT, **meta}
        atomic_write_bytes(self.path / _META, (json_text(body, indent=2) + "\n").encode())

    # ------------------------------------------------------------------ chunks
    def part_files(self) -> list[Path]:
        """Finished chunks, oldest first."""
        return sorted(p for p in (self.path / _PARTS).glob("part-*.parquet"))

    def write_part(self, rows: Sequence[dict[str, Any]]) -> Path | None:
        """Write ``rows`` (whole conditions) as one chunk, atomically; returns its path."""
        if not rows:
            return None
        name = f"part-{time.time_ns():020d}-{os.getpid()}.parquet"
        final = self.path / _PARTS / name
        with atomic_file(final) as tmp:
            write_parquet(tmp, rows_to_table(rows), RESULT_ROW, store_format=_FORMAT)
        return final

    def _sources(self) -> list[Path]:
        res = self.path / RESULTS_FILE
        return ([res] if res.is_file() else []) + self.part_files()

    def done_pairs(self) -> set[tuple[str, str]]:
        """``(condition_id, condition_hash)`` of every stored condition (consolidated or in chunks)."""
        out: set[tuple[str, str]] = set()
        for src in self._sources():
            t = _read(src, ["condition_id", "condition_hash"])
            out.update(zip(t["condition_id"].to_pylist(), t["condition_hash"].to_pylist(), strict=True))
        return out

    def table(self) -> pa.Table:
        """Every stored result, the latest per condition ID (chunks newer than the consolidated table)."""
        tables = [_read(src) for src in self._sources()]
        if not tables:
            return RESULT_SCHEMA.empty_table()
        t = pa.concat_tables(tables)
        ids = t["condition_id"].to_pylist()
        hashes = t["condition_hash"].to_pylist()
        latest: dict[str, str] = {}
        for cid, h in zip(ids, hashes, strict=True):
            latest[cid] = h   # later sources win
        keep = [latest[c] == h for c, h in zip(ids, hashes, strict=True)]
        t = t.filter(pa.array(keep))
        return _dedupe(t)

    def consolidate(self, planned: Sequence[PlannedCondition], meta: dict[str, Any]) -> pa.Table:
        """Write ``results.parquet`` holding exactly ``planned`` (in plan order), then drop the chunks."""
        t = self.table()
        order = {(p.condition_id, p.condition_hash): i for i, p in enumerate(planned)}
        pairs = list(zip(t["condition_id"].to_pylist(), t["condition_hash"].to_pylist(), strict=True))
        missing = set(order) - set(pairs)
        if missing:
            raise ValidationError(f"{len(missing)} planned conditions have no stored result; run again",
                                  source=str(self.path))
        keep = [i for i, pair in enumerate(pairs) if pair in order]
        t = t.take(pa.array(keep, pa.int64()))
        rank = {m: i for i, m in enumerate(METRICS)}
        pairs = [pairs[i] for i in keep]
        metrics = t["metric"].to_pylist()
        idx = sorted(range(t.num_rows), key=lambda i: (order[pairs[i]], rank.get(metrics[i], len(rank)),
                                                       metrics[i]))
        t = t.take(pa.array(idx, pa.int64()))
        with atomic_file(self.path / RESULTS_FILE) as tmp:
            write_parquet(tmp, t, RESULT_ROW, store_format=_FORMAT, spec_name=meta.get("spec_name"),
                          spec_sha256=meta.get("spec_sha256"), n_conditions=meta.get("n_conditions"))
        for part in self.part_files():
            with contextlib.suppress(OSError):
                part.unlink()
        self.write_meta(meta)
        return t

    def clean_temporaries(self) -> int:
        """Remove chunk temporaries left by a killed run (they were never renamed into place)."""
        n = 0
        for tmp in list((self.path / _PARTS).glob(".part-*.tmp")) + list(self.path.glob(".*.tmp")):
            with contextlib.suppress(OSError):
                tmp.unlink()
                n += 1
        return n


def _dedupe(t: pa.Table) -> pa.Table:
    """Drop repeated (condition_id, metric) rows (a crash between consolidation and chunk removal)."""
    ids = t["condition_id"].to_pylist()
    metrics = t["metric"].to_pylist()
    seen: set[tuple[str, str]] = set()
    keep = []
    for i, key in enumerate(zip(ids, metrics, strict=True)):
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return t if len(keep) == t.num_rows else t.take(pa.array(keep, pa.int64()))


def _read(path: Path, columns: list[str] | None = None) -> pa.Table:
    try:
        t = pq.read_table(path, columns=columns)
    except (pa.ArrowInvalid, OSError) as exc:
        hint = ("delete it to recompute its conditions" if path.parent.name == _PARTS or path.name == RESULTS_FILE
                else "expected a results.parquet of `expertcache spec run`")
        raise ValidationError(f"not a readable Parquet file ({exc}); {hint}", source=str(path)) from None
    if columns:
        return t
    for name in RESULT_SCHEMA.names:         # tables of format 1 lack the warm-transition fields: all null
        if name not in t.column_names:
            if name not in _FIELD_TYPES:
                raise ValidationError(f"missing column {name!r}; expected a results table of `expertcache spec run`",
                                      source=str(path))
            t = t.append_column(name, pa.nulls(t.num_rows, _FIELD_TYPES[name]))
    try:
        return t.select(RESULT_SCHEMA.names).cast(RESULT_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
        raise ValidationError(f"columns of the wrong type ({exc}); expected a results table of `expertcache spec "
                              "run`", source=str(path)) from None


def read_results(path: str | os.PathLike[str]) -> pa.Table:
    """The tidy result table of a store directory, or of a Parquet file with the same columns."""
    p = Path(path)
    if p.is_file():
        return _read(p)
    return ResultStore.open(p).table()
