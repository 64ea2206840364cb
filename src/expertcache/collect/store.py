"""On-disk layout of a collection: identity, crash-safe shards, the final trace, array reader.

::

    TRACE_DIR/
      collection.json          identity of the collection (model, config, prompts, parameters)
      shards/00000/            one complete RoutingTrace directory per shard, written atomically:
        routes.parquet           routes of the shard's requests (+ probs, entropy, margin)
        hidden.npy, logits.npy   optional fp16 arrays, rows aligned with routes (n, L, d|N)
        manifest.json            sha256 of every file above, per-request metadata
      routes.parquet           all shards merged (what read_trace loads)
      manifest.json            written last: provenance, shard hashes, array files with sha256

A shard exists only once complete (temporary directory renamed into place), so
an interrupted run leaves finished shards plus at most a hidden temporary
directory, which a re-run deletes before redoing that shard.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import IntegrityError, ValidationError
from ..storage import (
    MANIFEST,
    atomic_directory,
    atomic_write_bytes,
    exclusive_lock,
    inside,
    json_text,
    read_manifest,
    read_npy,
    sha256_file,
    write_manifest,
    write_table,
)
from ..trace import RoutingTrace, read_trace
from ..trace.model import ROUTES_ROW

__all__ = ["read_array", "ARRAY_NAMES", "check_output", "check_identity", "write_identity", "shard_dir", "shard_done",
           "write_shard", "open_shard", "ShardWriter", "finalize", "IDENTITY"]

#: Names of the optional per-(token, layer) arrays.
ARRAY_NAMES = {"hidden": "--save-hidden", "logits": "--save-logits"}
IDENTITY = "collection.json"
_ROUTES = "routes.parquet"
_KIND = "routing_trace"


def _dumps(obj: Any) -> str:
    return json_text(obj, indent=2) + "\n"


def identity_sha256(identity: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of ``identity``."""
    import hashlib

    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def check_output(out: Path) -> None:
    """Refuse an output that can never hold a collection: a file, or a non-empty directory without one.

    Raises
    ------
    ValidationError
        Saying what ``out`` is and to choose another ``-o``.
    """
    if not out.exists():
        return
    if not out.is_dir():
        raise ValidationError("output exists and is not a directory; choose another -o", source=str(out))
    if not (out / IDENTITY).is_file() and any(out.iterdir()):
        raise ValidationError("output directory is not empty and holds no expertcache collection "
                              f"({IDENTITY} missing); choose another -o", source=str(out))


def check_identity(out: Path, identity: dict[str, Any]) -> bool:
    """Whether ``out`` already holds this collection (True), or is absent/empty (False).

    Raises
    ------
    ValidationError
        If ``out`` holds something else: another collection (naming the fields
        that differ) or files not written by ``expertcache collect``.
    """
    check_output(out)
    path = out / IDENTITY
    if not out.exists() or not path.is_file():
        return False
    try:
        stored = json.loads(path.read_text())["identity"]
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError):
        raise IntegrityError("not a valid collection identity file; choose another -o", source=str(path)) from None
    if stored != identity:
        keys = sorted(k for k in set(stored) | set(identity) if stored.get(k) != identity.get(k))
        if "params" in keys:
            p0, p1 = stored.get("params") or {}, identity.get("params") or {}
            keys += [f"params.{k}" for k in sorted(set(p0) | set(p1)) if p0.get(k) != p1.get(k)]
        raise ValidationError(f"output directory holds a different collection (differs in: {', '.join(keys)}); "
                              "choose another -o to keep it, or delete it to start over", source=str(out))
    return True


def write_identity(out: Path, identity: dict[str, Any]) -> None:
    """Create ``out`` and its identity file (atomically) if absent."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / IDENTITY
    if not path.exists():
        body = {"kind": "expertcache_collection", "collection_sha256": identity_sha256(identity),
                "identity": identity}
        _write_text_atomic(path, _dumps(body))


def _write_text_atomic(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def collection_lock(out: Path):
    """Hold ``out/.lock`` while a run writes the collection: a second concurrent ``collect`` into the same
    directory is refused (naming the holder's pid and host); a killed run's lock is taken over."""
    return exclusive_lock(out, "collection")


def shard_dir(out: Path, index: int) -> Path:
    """Directory of shard ``index``."""
    return out / "shards" / f"{index:05d}"


def clean_partial(out: Path) -> None:
    """Delete temporary directories an interrupted run left under ``out/shards``."""
    shards = out / "shards"
    if shards.is_dir():
        for p in shards.iterdir():
            if p.name.startswith("."):
                shutil.rmtree(p, ignore_errors=True)
    for p in out.glob(".*.tmp"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def shard_done(out: Path, index: int, collection_sha: str) -> bool:
    """Whether shard ``index`` is complete: present, of this collection, every file matching its hash."""
    d = shard_dir(out, index)
    if not (d / MANIFEST).is_file():
        return False
    manifest = read_manifest(d, _KIND)
    if manifest.get("provenance", {}).get("collection_sha256") != collection_sha:
        raise ValidationError("shard belongs to a different collection; delete the output directory",
                              source=str(d))
    for name, entry in manifest["files"].items():
        p = d / name
        if not p.is_file() or sha256_file(p) != entry.get("sha256"):
            raise IntegrityError("shard file missing or modified (sha256 mismatch); delete this shard "
                                 "directory and re-run to recollect it", source=str(p))
    return True


class ShardWriter:
    """One shard being written into its temporary directory (see :func:`open_shard`).

    Array rows are appended batch by batch straight to disk (``.<name>.part``
    files of raw fp16 rows), so a shard's hidden states are never all in memory;
    :meth:`finish` writes ``routes.parquet``, turns each part into a plain
    ``<name>.npy`` (the same bytes ``np.save`` writes) and writes ``manifest.json`` last.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.finished = False
        self._parts: dict[str, tuple[Any, tuple[int, ...]]] = {}   # name -> (open file, trailing shape)
        self._rows: dict[str, int] = {}

    def append(self, arrays: dict[str, np.ndarray]) -> None:
        """Append rows (``[n, ...]``, stored as float16) to each named array of the shard."""
        for name, arr in sorted(arrays.items()):
            data = np.ascontiguousarray(arr, dtype=np.float16)
            if name not in self._parts:
                self._parts[name] = (open(self.directory / f".{name}.part", "wb"), data.shape[1:])
                self._rows[name] = 0
            handle, trailing = self._parts[name]
            if data.shape[1:] != trailing:
                raise ValueError(f"{name}: rows of shape {data.shape[1:]} after {trailing}")
            data.tofile(handle)
            self._rows[name] += data.shape[0]

    def close(self) -> None:
        """Close the part files (idempotent)."""
        for handle, _ in self._parts.values():
            handle.close()

    def finish(self, trace: RoutingTrace) -> None:
        """Write the routes, the ``.npy`` arrays (rows must match ``trace``) and the manifest."""
        self.close()
        tmp = self.directory
        files = {_ROUTES: write_table(tmp, _ROUTES, trace.to_table(), ROUTES_ROW,
                                      shape=(trace.n_layers, trace.n_experts, trace.top_k))}
        array_entries: dict[str, list[dict[str, Any]]] = {}
        for name, (_, trailing) in sorted(self._parts.items()):
            rows = self._rows[name]
            if rows != trace.n_tokens:
                raise ValueError(f"{name}: {rows} rows for a shard of {trace.n_tokens} tokens")
            part, fname = tmp / f".{name}.part", f"{name}.npy"
            header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float16)), "fortran_order": False,
                      "shape": (rows, *trailing)}
            with open(tmp / fname, "wb") as dst, open(part, "rb") as src:
                np.lib.format.write_array_header_1_0(dst, header)
                shutil.copyfileobj(src, dst)
            part.unlink()
            entry = {"sha256": sha256_file(tmp / fname), "rows": rows}
            files[fname] = entry
            array_entries[name] = [{"file": fname, **entry}]
        write_manifest(tmp, _trace_manifest(trace, files, array_entries))
        self.finished = True


@contextlib.contextmanager
def open_shard(out: Path, index: int) -> Iterator[ShardWriter]:
    """Write shard ``index`` of ``out`` in a temporary directory renamed into place on success.

    The body must call :meth:`ShardWriter.finish`; an exception (or a missing
    ``finish``) leaves no shard directory behind.
    """
    d = shard_dir(out, index)
    d.parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(d) as tmp:
        writer = ShardWriter(tmp)
        try:
            yield writer
        finally:
            writer.close()
        if not writer.finished:
            raise RuntimeError(f"shard {index} was not finished")


def write_shard(out: Path, index: int, trace: RoutingTrace, arrays: dict[str, np.ndarray]) -> None:
    """Write one shard atomically: routes.parquet, the arrays as .npy, manifest.json last."""
    with open_shard(out, index) as writer:
        writer.append(arrays)
        writer.finish(trace)


def _trace_manifest(trace: RoutingTrace, files: dict[str, Any], arrays: dict[str, Any]) -> dict[str, Any]:
    return {"kind": _KIND, "n_layers": trace.n_layers, "n_experts": trace.n_experts, "top_k": trace.top_k,
            "n_requests": trace.n_requests, "n_tokens": trace.n_tokens, "has_gates": trace.gates is not None,
            "provenance": trace.provenance, "files": files, "arrays": arrays}


def _concat(traces: list[RoutingTrace], provenance: dict[str, Any]) -> RoutingTrace:
    first = traces[0]
    ids: list[str] = []
    request = []
    for t in traces:
        request.append(t.request + len(ids))
        ids.extend(t.request_ids)

    def cat(name: str) -> np.ndarray | None:
        parts = [getattr(t, name) for t in traces]
        return None if any(p is None for p in parts) else np.concatenate(parts)

    return RoutingTrace(first.n_layers, first.n_experts, first.top_k, tuple(ids), np.concatenate(request),
                        cat("phase"), cat("position"), cat("experts"), cat("gates"), cat("token_id"),
                        provenance, cat("probs"), cat("entropy"), cat("margin"))


def finalize(out: Path, n_shards: int, provenance: dict[str, Any]) -> RoutingTrace:
    """Merge the complete shards into ``routes.parquet`` and write ``manifest.json`` last.

    ``provenance`` is completed with the shard hashes and the per-request
    metadata of every shard.
    """
    traces, shard_entries = [], []
    requests: dict[str, Any] = {}
    arrays: dict[str, list[dict[str, Any]]] = {}
    for i in range(n_shards):
        d = shard_dir(out, i)
        tr = read_trace(d)
        traces.append(tr)
        manifest = read_manifest(d, _KIND)
        rel = d.relative_to(out).as_posix()
        shard_entries.append({"dir": rel, "manifest_sha256": sha256_file(d / MANIFEST),
                              "files": {k: v["sha256"] for k, v in sorted(manifest["files"].items())},
                              "n_requests": tr.n_requests, "n_tokens": tr.n_tokens})
        requests.update(tr.provenance.get("requests", {}))
        for name, entries in manifest.get("arrays", {}).items():
            arrays.setdefault(name, []).extend({**e, "file": f"{rel}/{e['file']}"} for e in entries)
    prov = {**provenance, "shards": shard_entries, "requests": requests}
    trace = _concat(traces, prov)
    tmp = out / f".{_ROUTES}.tmp"
    entry = write_table(out, tmp.name, trace.to_table(), ROUTES_ROW,
                        shape=(trace.n_layers, trace.n_experts, trace.top_k))
    os.replace(tmp, out / _ROUTES)
    body = _trace_manifest(trace, {_ROUTES: entry}, arrays)
    tmp_dir = out / ".manifest.tmp"
    tmp_dir.mkdir(exist_ok=True)
    write_manifest(tmp_dir, body)
    os.replace(tmp_dir / MANIFEST, out / MANIFEST)
    tmp_dir.rmdir()
    return trace


def read_array(trace_dir: str | os.PathLike[str], name: str) -> np.ndarray:
    """Load a collected per-(token, layer) array, rows aligned with ``read_trace(trace_dir)``.

    Parameters
    ----------
    trace_dir
        A trace directory written by ``expertcache collect`` (or one of its shards).
    name
        ``"hidden"``: the hidden state entering each MoE block, ``float16[n_tokens, L, d_model]``;
        ``"logits"``: the full router logits, ``float16[n_tokens, L, N]``.

    Raises
    ------
    ValidationError
        Unknown ``name``, or the array was not collected (re-run with
        ``--save-hidden`` / ``--save-logits``); IntegrityError on a hash mismatch.
    """
    if name not in ARRAY_NAMES:
        raise ValidationError(f"expected one of {', '.join(ARRAY_NAMES)}; got {name!r}", field="name")
    directory = Path(trace_dir)
    manifest = read_manifest(directory, _KIND)
    entries = manifest.get("arrays", {}).get(name)
    if not entries:
        raise ValidationError(f"this trace has no {name!r} array; collect with {ARRAY_NAMES[name]}",
                              source=str(directory))
    L, n = manifest["n_layers"], manifest.get("n_tokens")
    src = str(directory / MANIFEST)
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise IntegrityError("expected a list of {file, sha256, rows} entries", source=src, field=f"arrays.{name}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise IntegrityError(f"expected a positive n_tokens; got {str(n)[:40]}", source=src, field="n_tokens")
    parts = []
    for e in entries:
        path = inside(directory, e.get("file"), src, f"arrays.{name}[].file")
        rows = e.get("rows")
        if isinstance(rows, bool) or not isinstance(rows, int) or not 0 < rows <= n:
            raise IntegrityError(f"expected rows in [1, {n}]; got {str(rows)[:40]}", source=src,
                                 field=f"arrays.{name}[].rows")
        if not path.is_file():
            raise IntegrityError("listed in manifest.json but missing", source=str(path))
        if sha256_file(path) != e.get("sha256"):
            raise IntegrityError("sha256 mismatch: the file was modified or truncated; re-collect it",
                                 source=str(path))
        try:
            arr = read_npy(path, expect_shape=(rows, L, None), expect_dtypes={"float16"})
        except ValidationError as exc:
            raise IntegrityError(f"expected float16[{rows}, {L}, *]: {exc.detail}", source=str(path)) from None
        parts.append(arr)
    out = parts[0] if len(parts) == 1 else np.concatenate(parts)
    if out.shape[0] != n:
        raise IntegrityError(f"arrays hold {out.shape[0]} rows; the trace has {n} tokens", source=str(directory))
    return out
