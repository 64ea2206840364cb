"""Directory storage shared by traces and streams: manifest, hashes, atomic writes.

A stored object is a directory holding Parquet files and a ``manifest.json``
with the schema version, the model shape ``(L, N, k)``, provenance and the
sha256 of every data file (docs/design.md §3). Writes go to a hidden temporary
sibling directory that is renamed into place only when complete, so a failed
write never leaves a half-written output behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from . import __version__
from .errors import IntegrityError, OutputExistsError, ValidationError

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
_KINDS = {
    "routing_trace": "a routing trace directory (from `expertcache trace import`)",
    "event_stream": "an event stream directory (from `expertcache events build` or `events import`)",
}


def sha256_file(path: Path) -> str:
    """Return the hex sha256 digest of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def atomic_directory(out: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``out`` only on success.

    Raises
    ------
    OutputExistsError
        If ``out`` exists and ``overwrite`` is false.
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise OutputExistsError(
            f"{out}: output already exists; choose another path or pass --overwrite"
        )
    parent = out.parent if str(out.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=parent))
    try:
        yield tmp
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=parent))
            os.replace(out, old / "x")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a hidden temporary file next to ``path``; on success it is synced and renamed onto ``path``.

    A failure (or a kill) leaves ``path`` as it was and removes the temporary file (a kill may leave
    a hidden ``.NAME.*.tmp`` sibling). The parent directory must exist.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise ValidationError(f"{path}: the folder {path.parent} does not exist; create it or choose another path")
    if path.is_dir():
        raise ValidationError(f"{path}: is a directory; give a file path")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through :func:`atomic_file`."""
    with atomic_file(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)


def write_table(directory: Path, name: str, table: pa.Table) -> dict[str, Any]:
    """Write ``table`` as ``directory/name`` (zstd Parquet); return its manifest entry."""
    path = directory / name
    pq.write_table(table, path, compression="zstd")
    return {"sha256": sha256_file(path), "rows": table.num_rows}


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` with the schema and tool version filled in."""
    body = {"schema_version": SCHEMA_VERSION, "tool_version": __version__, **manifest}
    (directory / MANIFEST).write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")


def read_manifest(directory: str | os.PathLike[str], kind: str) -> dict[str, Any]:
    """Read and check the manifest of a stored ``kind`` ("routing_trace", "event_stream")."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not directory.is_dir():
        raise ValidationError(f"expected a directory written by expertcache; got {'a file' if directory.exists() else 'nothing'}",
                              source=str(directory))
    if not path.is_file():
        raise IntegrityError("manifest.json is missing; is this a directory written by expertcache?",
                             source=str(directory))
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"not valid JSON ({exc}); the file is truncated or corrupt",
                             source=str(path)) from None
    if not isinstance(manifest, dict):
        raise IntegrityError("expected a JSON object", source=str(path))
    if manifest.get("kind") != kind:
        got = manifest.get("kind")
        raise ValidationError(f"expected {_KINDS.get(kind, kind)}; got {_KINDS.get(got, repr(got))}",
                              source=str(path), field="kind")
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValidationError(f"unsupported schema version {version!r}; this expertcache reads version {SCHEMA_VERSION}",
                              source=str(path), field="schema_version")
    for key in ("n_layers", "n_experts", "top_k"):
        value = manifest.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValidationError(f"must be a positive integer; got {value!r}", source=str(path), field=key)
    if not isinstance(manifest.get("files"), dict):
        raise IntegrityError("no 'files' table", source=str(path), field="files")
    return manifest


def read_table(directory: str | os.PathLike[str], manifest: dict[str, Any], name: str) -> pa.Table:
    """Read ``name`` after checking it exists and matches its manifest sha256."""
    directory = Path(directory)
    entry = manifest["files"].get(name)
    path = directory / name
    if entry is None:
        raise IntegrityError(f"manifest.json does not list {name}", source=str(directory))
    if not path.is_file():
        raise IntegrityError("listed in manifest.json but missing", source=str(path))
    actual = sha256_file(path)
    if actual != entry.get("sha256"):
        raise IntegrityError(
            f"sha256 mismatch (manifest {str(entry.get('sha256'))[:12]}…, file {actual[:12]}…): "
            "the file was modified or truncated; re-create it",
            source=str(path),
        )
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise IntegrityError(f"not a readable Parquet file ({exc})", source=str(path)) from None
    if table.num_rows != entry.get("rows"):
        raise IntegrityError(f"expected {entry.get('rows')} rows; found {table.num_rows}", source=str(path))
    return table


def require_columns(table: pa.Table, columns: dict[str, str], source: str) -> None:
    """Check that ``table`` has each column, by name; ``columns`` maps name -> description."""
    for name, what in columns.items():
        if name not in table.column_names:
            raise ValidationError(f"missing column ({what})", source=source, field=name)
