"""A bridge to libCacheSim: an event stream's accesses as libCacheSim traces, with the capacities to use.

libCacheSim replays one request at a time, which is this project's
``sequential-ascending`` replay (docs/semantics.md): within an event the members
are requested in ascending expert id, and the cache is updated after every
request. Its policies therefore run on exactly our accesses, but under the
sequential contract, never the event-atomic one. Per-layer scope writes one
trace per MoE layer (object id = expert id, capacity = that layer's quota
``c_l``); global scope writes one trace of block ids ``layer * N + expert``
(capacity = the total). Every object has size 1, so capacities are object
counts.

Two formats:

``oraclegeneral``
    libCacheSim's binary ``oracleGeneral`` records (24 bytes, little-endian,
    packed): ``uint32 clock_time, uint64 obj_id, uint32 obj_size, int64
    next_access_vtime``, the last being the index of the object's next request
    in the same file (``INT64_MAX`` when there is none, libCacheSim's "never
    again"). Belady and the other oracle policies need it.
``csv``
    ``time,obj_id,obj_size`` with a header line; libCacheSim's CSV reader needs
    the column numbers (``time-col=1, obj-id-col=2, obj-size-col=3``,
    ``has-header=true``); no next-access field, so oracle policies cannot run.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..events import EventStream
from ..storage import atomic_directory, json_text
from .engine import capacities_for_rho, total_capacity

__all__ = ["FORMATS", "ORACLE_GENERAL", "NEVER_AGAIN", "ExportedTrace", "LibCacheSimExport", "flatten_accesses",
           "next_access_vtime", "write_oracle_general", "export_stream", "EXPORT_FILE"]

FORMATS = ("oraclegeneral", "csv")
#: libCacheSim's oracleGeneral record.
ORACLE_GENERAL = np.dtype([("clock_time", "<u4"), ("obj_id", "<u8"), ("obj_size", "<u4"),
                           ("next_access_vtime", "<i8")])
NEVER_AGAIN = np.iinfo(np.int64).max
EXPORT_FILE = "export.json"
_SUFFIX = {"oraclegeneral": ".oracleGeneral.bin", "csv": ".csv"}


@dataclass(frozen=True)
class ExportedTrace:
    """One written trace: its file (relative to the export directory), capacity and request counts."""

    file: str
    layer: int | None
    capacity: int
    n_requests: int
    n_objects: int
    warmup_requests: int


@dataclass(frozen=True)
class LibCacheSimExport:
    """What :func:`export_stream` wrote (also stored as ``export.json`` in the directory)."""

    format: str
    scope: str
    rho: float
    order: str
    traces: tuple[ExportedTrace, ...]
    warmup_events: int
    stream: dict[str, Any]
    csv_reader_params: dict[str, Any] | None
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["traces"] = [asdict(t) for t in self.traces]
        d["notes"] = list(self.notes)
        return d


def flatten_accesses(stream: EventStream, scope: str = "per-layer") -> list[tuple[int | None, np.ndarray,
                                                                                   np.ndarray, np.ndarray]]:
    """The stream's accesses in sequential-ascending order: ``(layer, object ids, clock, event index)`` per trace.

    Per-layer scope gives one entry per layer (object id = expert id, layer ``0..L-1``);
    global scope one entry (object id = ``layer * N + expert``, layer ``None``). The
    clock is the event's step; the event index says which event each request belongs to.
    """
    if scope not in ("per-layer", "global"):
        raise ValidationError(f"scope must be 'per-layer' or 'global'; got {scope!r}", field="scope")
    size = stream.event_size
    event = np.repeat(np.arange(stream.n_events, dtype=np.int64), size)
    layer = np.repeat(stream.layer.astype(np.int64), size)
    clock = np.repeat(stream.step.astype(np.int64), size)
    expert = stream.expert.astype(np.int64)
    if scope == "global":
        return [(None, layer * stream.n_experts + expert, clock, event)]
    order = np.argsort(layer, kind="stable")
    bounds = np.cumsum(np.bincount(layer, minlength=stream.n_layers))[:-1]
    return [(l, ids, clk, ev) for l, (ids, clk, ev) in
            enumerate(zip(np.split(expert[order], bounds), np.split(clock[order], bounds),
                          np.split(event[order], bounds), strict=True))]


def next_access_vtime(ids: np.ndarray) -> np.ndarray:
    """For each request, the index of the next request for the same object (``NEVER_AGAIN`` when there is none).

    >>> nxt = next_access_vtime(np.array([3, 1, 3, 3, 1]))
    >>> nxt[:3].tolist(), bool((nxt[3:] == NEVER_AGAIN).all())
    ([2, 4, 3], True)
    """
    ids = np.asarray(ids)
    order = np.argsort(ids, kind="stable")
    nxt = np.full(ids.shape[0], NEVER_AGAIN, dtype=np.int64)
    same = ids[order[1:]] == ids[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


def write_oracle_general(path: str | os.PathLike[str], ids: np.ndarray, clock: np.ndarray,
                         nxt: np.ndarray | None = None) -> int:
    """Write one oracleGeneral trace (object size 1); ``nxt`` defaults to :func:`next_access_vtime`. Returns bytes."""
    rec = np.empty(ids.shape[0], dtype=ORACLE_GENERAL)
    rec["clock_time"] = clock
    rec["obj_id"] = ids
    rec["obj_size"] = 1
    rec["next_access_vtime"] = next_access_vtime(ids) if nxt is None else nxt
    rec.tofile(path)
    return rec.nbytes


def _write(path: Path, fmt: str, ids: np.ndarray, clock: np.ndarray) -> None:
    if fmt == "oraclegeneral":
        write_oracle_general(path, ids, clock)
        return
    with open(path, "w", encoding="ascii", newline="\n") as fh:
        fh.write("time,obj_id,obj_size\n")
        for start in range(0, ids.shape[0], 1 << 20):  # chunks keep the text buffer bounded
            block = np.column_stack([clock[start:start + (1 << 20)], ids[start:start + (1 << 20)],
                                     np.ones(min(1 << 20, ids.shape[0] - start), dtype=np.int64)])
            np.savetxt(fh, block, fmt="%d", delimiter=",")


def export_stream(stream: EventStream, out: str | os.PathLike[str], fmt: str = "oraclegeneral",
                  scope: str = "per-layer", rho: float = 0.4, *, overwrite: bool = False,
                  stream_info: dict[str, Any] | None = None) -> LibCacheSimExport:
    """Write ``stream``'s accesses as libCacheSim traces into the directory ``out`` (atomically).

    Parameters
    ----------
    stream
        The event stream; all its events are written, warm-up events included (libCacheSim
        counts every request, so ``warmup_requests`` per trace says how many to discount).
    out
        The directory to create; ``export.json`` in it lists each trace with its capacity.
    fmt
        ``"oraclegeneral"`` (binary, with next-access times) or ``"csv"``.
    scope
        ``"per-layer"`` (one trace per layer, capacity ``c_l`` by the quota rule) or ``"global"``.
    rho
        Residency fraction the capacities are computed for (docs/design.md §2).
    stream_info
        Where the stream came from (path, manifest sha256), recorded in ``export.json``.
    """
    if fmt not in FORMATS:
        raise ValidationError(f"format must be one of {', '.join(FORMATS)}; got {fmt!r}", field="format")
    if not (isinstance(rho, (int, float)) and 0.0 <= float(rho) <= 1.0):
        raise ValidationError(f"rho must be in [0, 1]; got {rho!r}", field="rho")
    L, N = stream.n_layers, stream.n_experts
    caps = ([total_capacity(rho, L, N)] if scope == "global" else [int(c) for c in capacities_for_rho(rho, L, N)])
    warm = int(stream.provenance.get("warmup_events", 0) or 0)
    traces, notes = [], [
        "libCacheSim replays request by request: compare with expertcache's sequential-ascending replay, "
        "not the event-atomic one",
        "libCacheSim's LFU forgets an object's count when it is evicted (expertcache's lfu keeps it unless "
        "--lfu-in-cache-counters)",
        "libCacheSim's Belady admits every miss: it matches belady-forced, not belady (which may bypass)",
    ]
    if min(caps) < 4:
        notes.append(f"capacities as small as {min(caps)}: some libCacheSim policies (segmented or sampled ones: "
                     "S3-FIFO, ARC, LeCaR, LRB) degenerate on caches of a handful of objects")
    if warm:
        notes.append(f"the first {warm} events are the stream's warm-up (expertcache replay does not count them); "
                     "libCacheSim counts them: subtract warmup_requests' misses or compare with --warmup-events 0")
    with atomic_directory(out, overwrite=overwrite) as tmp:
        for layer, ids, clock, event in flatten_accesses(stream, scope):
            name = ("global" if layer is None else f"layer{layer:03d}") + _SUFFIX[fmt]
            _write(tmp / name, fmt, ids, clock)
            traces.append(ExportedTrace(name, layer, int(caps[0] if layer is None else caps[layer]),
                                        int(ids.shape[0]), int(np.unique(ids).shape[0]),
                                        int((event < warm).sum())))
        result = LibCacheSimExport(
            fmt, scope, float(rho), "sequential-ascending", tuple(traces), warm,
            dict(stream_info or {}) | {"n_layers": L, "n_experts": N, "top_k": stream.top_k,
                                       "n_events": stream.n_events, "union": int(stream.expert.shape[0])},
            {"time_field": 1, "obj_id_field": 2, "obj_size_field": 3, "has_header": True, "delimiter": ","}
            if fmt == "csv" else None,
            tuple(notes))
        (tmp / EXPORT_FILE).write_text(json_text({"tool": "expertcache", **result.to_dict()}, indent=2) + "\n")
    return result
