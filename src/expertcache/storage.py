"""Directory storage shared by traces and streams: manifest, hashes, atomic writes, the overwrite rule.

A stored object is a directory holding Parquet files and a ``manifest.json``
with the schema version, the model shape ``(L, N, k)``, provenance and the
sha256 of every data file (docs/design.md §3). Writes go to a hidden temporary
sibling directory that is renamed into place only when complete, so a failed
write never leaves a half-written output behind.

The safety contract of every writer (docs/safety.md):

- an existing output is refused unless ``--overwrite`` is given
  (:func:`check_output`);
- ``--overwrite`` replaces only a directory this tool wrote: one holding the
  :data:`MARKER` file every :func:`atomic_directory` writes, or a manifest of
  this tool (``manifest.json``, ``store.json``, ``collection.json`` with its
  ``kind``), or an empty directory. Anything else, a symbolic link, the file
  system root, the working directory or one of its ancestors is refused with
  one line, before any work;
- temporary files and directories are created with the umask's modes (not
  the 0600/0700 of :mod:`tempfile`), so outputs in shared folders stay
  readable;
- an ``OSError`` while writing (a full disk) names the output it was writing.
"""

from __future__ import annotations

import contextlib
import errno as _errno
import hashlib
import json
import os
import secrets
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from . import __version__
from . import jsonl as _jsonl
from .errors import IntegrityError, OutputExistsError, ValidationError

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
#: Written into every directory :func:`atomic_directory` creates: what lets ``--overwrite`` replace it.
MARKER = ".expertcache-output"
_MARKER_TEXT = "written by expertcache; `--overwrite` may replace this directory (docs/safety.md)\n"
#: Manifest files (and their ``kind``) that identify a directory this tool wrote.
_OWN_MANIFESTS = {
    MANIFEST: None,                       # any kind: routing_trace, event_stream, probe_set, ...
    "store.json": "experiment_store",
    "collection.json": "expertcache_collection",
    "trainer.json": None,                 # a router checkpoint
}
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


# ----------------------------------------------------------------------------- the overwrite rule
def written_by_us(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory`` is one this tool wrote (marker file or own manifest) or an empty one."""
    d = Path(directory)
    if d.is_symlink() or not d.is_dir():
        return False
    if (d / MARKER).is_file():
        return True
    for name, kind in _OWN_MANIFESTS.items():
        p = d / name
        if not p.is_file() or p.is_symlink():
            continue
        try:
            if p.stat().st_size > 64 << 20:
                continue
            body = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            continue
        if not isinstance(body, dict):
            continue
        if name == "trainer.json":
            if (d / "routers.safetensors").is_file():
                return True
            continue
        if kind is None and isinstance(body.get("kind"), str) and ("tool_version" in body
                                                                   or "schema_version" in body):
            return True
        if kind is not None and body.get("kind") == kind:
            return True
    try:
        return not any(d.iterdir())
    except OSError:
        return False


def _dangerous(out: Path) -> str | None:
    """Why replacing ``out`` would be unsafe whatever it holds, or None."""
    try:
        resolved = out.resolve()
    except (OSError, RuntimeError):
        return "cannot resolve the path"
    if resolved == Path(resolved.anchor) or not resolved.name:
        return "is the file-system root"
    try:
        cwd = Path.cwd().resolve()
    except OSError:
        cwd = None
    if cwd is not None and (resolved == cwd or resolved in cwd.parents):
        return "is the working directory or one of its ancestors"
    home = Path.home()
    with contextlib.suppress(OSError, RuntimeError):
        if resolved == home.resolve():
            return "is the home directory"
    return None


def check_output(out: str | os.PathLike[str], overwrite: bool, *, directory: bool = True) -> None:
    """Refuse an output path that must not be written, before any work is done.

    Parameters
    ----------
    out
        The output path.
    overwrite
        Whether ``--overwrite`` was given.
    directory
        True for an output directory, False for an output file.

    Raises
    ------
    OutputExistsError
        ``out`` exists and ``overwrite`` is false, or it exists and may not be
        replaced even with ``overwrite`` (see the module docstring).
    """
    out = Path(out)
    danger = _dangerous(out)
    if danger and (overwrite or out.exists()):
        raise OutputExistsError(f"{out}: {danger}; it is never replaced; choose a new output path")
    if not (out.exists() or out.is_symlink()):
        return
    if not overwrite:
        raise OutputExistsError(f"{out}: output already exists; choose another path or pass --overwrite")
    if directory:
        if out.is_symlink():
            raise OutputExistsError(f"{out}: is a symbolic link; --overwrite does not follow or replace links; "
                                    "choose a new output path")
        if not out.is_dir():
            raise OutputExistsError(f"{out}: is a file, not an output directory of expertcache; --overwrite "
                                    "replaces only directories this tool wrote; choose a new output path")
        if not written_by_us(out):
            raise OutputExistsError(f"{out}: not a directory written by expertcache (no {MARKER} or manifest); "
                                    "--overwrite replaces only those; choose a new output path or delete it yourself")
    else:
        if out.is_dir() and not out.is_symlink():
            raise OutputExistsError(f"{out}: is a directory; give a file path")
        if out.exists() and not out.is_file():
            raise OutputExistsError(f"{out}: is not a regular file; choose another path")


def _mkdir_unique(parent: Path, stem: str, suffix: str) -> Path:
    """Create a new hidden directory ``parent/.stem.RANDOM.suffix`` with the umask's mode."""
    for _ in range(100):
        p = parent / f".{stem}.{secrets.token_hex(4)}{suffix}"
        try:
            os.mkdir(p, 0o777)
            return p
        except FileExistsError:
            continue
    raise OSError(_errno.EEXIST, "cannot create a temporary directory", str(parent))


def _named(exc: OSError, out: Path, tmp: Path | None) -> OSError:
    """``exc`` with ``out`` as its file name when it names none (or only the temporary)."""
    name = exc.filename
    if name is None or (tmp is not None and str(name).startswith(str(tmp))):
        err = exc.errno if exc.errno is not None else _errno_of(exc)
        new = OSError(err, exc.strerror or str(exc), str(out))
        return new
    return exc


def _errno_of(exc: OSError) -> int | None:
    text = str(exc).lower()
    if "no space left" in text:
        return _errno.ENOSPC
    if "quota" in text:
        return _errno.EDQUOT
    return None


@contextlib.contextmanager
def atomic_directory(out: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``out`` only on success.

    The temporary directory is created with the umask's mode and receives
    :data:`MARKER`; an existing ``out`` is replaced only under the rule of
    :func:`check_output`, and the old directory is removed only after the new
    one is in place.

    Raises
    ------
    OutputExistsError
        If ``out`` exists and ``overwrite`` is false, or may not be replaced.
    """
    out = Path(out)
    check_output(out, overwrite)
    parent = out.parent if str(out.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = _mkdir_unique(parent, out.name, ".tmp")
        (tmp / MARKER).write_text(_MARKER_TEXT)
    except OSError as exc:
        raise _named(exc, out, None) from None
    try:
        yield tmp
        if out.exists() or out.is_symlink():
            check_output(out, overwrite)          # still ours at the instant of replacing
            old = parent / f".{out.name}.{secrets.token_hex(4)}.old"
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _named(exc, out, tmp) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a hidden temporary file next to ``path``; on success it is synced and renamed onto ``path``.

    A failure (or a kill) leaves ``path`` as it was and removes the temporary file (a kill may leave
    a hidden ``.NAME.*.tmp`` sibling). The parent directory must exist. The temporary file has the
    umask's mode (as a plain ``open`` would give).
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise ValidationError(f"{path}: the folder {path.parent} does not exist; create it or choose another path")
    if path.is_dir():
        raise ValidationError(f"{path}: is a directory; give a file path")
    tmp = None
    try:
        for _ in range(100):
            cand = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
            try:
                fd = os.open(cand, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                continue
            os.close(fd)
            tmp = str(cand)
            break
        else:
            raise OSError(_errno.EEXIST, "cannot create a temporary file", str(path))
    except OSError as exc:
        raise _named(exc, path, None) from None
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _named(exc, path, Path(tmp)) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through :func:`atomic_file`."""
    with atomic_file(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)


# ----------------------------------------------------------------------------- self-describing outputs
#: Prefix of the Parquet key-value metadata keys this tool writes (``expertcache.tool_version``, ...).
PARQUET_META_PREFIX = "expertcache."


def parquet_metadata(row: str, *, shape: tuple[int, int, int] | None = None,
                     **fields: Any) -> dict[str, str]:
    """The key-value metadata of a Parquet file this tool writes (docs/design.md §3).

    Parameters
    ----------
    row
        What one row of the table is, in words (``"one (token, layer): the top-k experts routed"``).
    shape
        The model shape ``(L, N, k)`` where known: ``n_layers``, ``n_experts``, ``top_k``.
    fields
        Further facts (the stream a table was computed from, ...); ``None`` values are left out,
        others are written as text (a dict or list as JSON).

    Returns
    -------
    dict
        ``{"expertcache.tool_version": ..., "expertcache.schema_version": "1", "expertcache.row": row, ...}``.
    """
    meta: dict[str, Any] = {"tool_version": __version__, "schema_version": SCHEMA_VERSION, "row": row}
    if shape is not None:
        meta.update(zip(("n_layers", "n_experts", "top_k"), (int(x) for x in shape), strict=True))
    meta.update({k: v for k, v in fields.items() if v is not None})
    return {PARQUET_META_PREFIX + k: v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
            for k, v in meta.items()}


def with_metadata(table: pa.Table, row: str, *, shape: tuple[int, int, int] | None = None,
                  **fields: Any) -> pa.Table:
    """``table`` with :func:`parquet_metadata` merged into its schema metadata (other keys kept)."""
    old = dict(table.schema.metadata or {})
    old.update({k.encode(): v.encode() for k, v in parquet_metadata(row, shape=shape, **fields).items()})
    return table.replace_schema_metadata(old)


def write_parquet(path: str | os.PathLike[str], table: pa.Table, row: str, *,
                  shape: tuple[int, int, int] | None = None, compression: str = "zstd", **fields: Any) -> None:
    """Write ``table`` to ``path`` as Parquet carrying :func:`parquet_metadata` (the one Parquet writer)."""
    pq.write_table(with_metadata(table, row, shape=shape, **fields), path, compression=compression)


def read_parquet_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The ``expertcache.*`` metadata of a Parquet file, prefix dropped; ``{}`` for a file without any.

    Files written before the metadata existed read as ``{}``; nothing else about reading them changes.
    """
    raw = pq.read_schema(path).metadata or {}
    n = len(PARQUET_META_PREFIX)
    return {k.decode()[n:]: v.decode() for k, v in raw.items() if k.decode(errors="replace").startswith(
        PARQUET_META_PREFIX)}


def stored_source(directory: str | os.PathLike[str], role: str = "stream") -> dict[str, Any]:
    """Name a stored input in a record: ``{role: path, role_manifest_sha256: sha256 of its manifest.json}``.

    The manifest holds the sha256 of every data file, so its hash identifies the data; ``None`` when the
    directory has no manifest (an input that is not a stored object).
    """
    path = Path(directory)
    manifest = path / MANIFEST
    sha = sha256_file(manifest) if manifest.is_file() else None
    return {role: str(path), f"{role}_manifest_sha256": sha}


def stream_source(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """:func:`stored_source` of an event-stream directory: ``{"stream": ..., "stream_manifest_sha256": ...}``."""
    return stored_source(directory, "stream")


#: Keys whose values are stored data echoed as recorded (request ids, file names as keys): never renamed.
VERBATIM_KEYS = frozenset({"provenance", "requests", "categories", "files"})


def snake_keys(obj: Any) -> Any:
    """``obj`` with every ``-`` in a mapping key written ``_`` (``belady-forced`` -> ``belady_forced``).

    A name used as a key (a policy, a semantics) thus reads like every other field; the values under
    :data:`VERBATIM_KEYS` are left as stored.
    """
    if isinstance(obj, dict):
        return {(k.replace("-", "_") if isinstance(k, str) else k): (v if k in VERBATIM_KEYS else snake_keys(v))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [snake_keys(v) for v in obj]
    return obj


def json_record(obj: Any, *, snake: bool = False) -> dict[str, Any]:
    """``obj`` (a mapping) with ``schema_version`` and ``tool_version`` first (docs/design.md §5).

    An object that already has a ``schema_version`` (a stored manifest) keeps its own. With ``snake``,
    keys go through :func:`snake_keys` (every ``--json`` line does).
    """
    body = {"schema_version": SCHEMA_VERSION, "tool_version": __version__, **dict(obj)}
    return snake_keys(body) if snake else body


def json_text(obj: Any, *, indent: int | None = None, snake: bool = False) -> str:
    """One JSON document (no trailing newline) of :func:`json_record`: keys sorted, values not JSON-native
    (paths, numpy scalars) as text. Every JSON file and ``--json`` line of the tool goes through it."""
    return json.dumps(json_record(obj, snake=snake), indent=indent, sort_keys=True, default=_jsonable)


def _jsonable(x: Any) -> Any:
    item = getattr(x, "item", None)            # numpy scalars
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    tolist = getattr(x, "tolist", None)        # numpy arrays
    if callable(tolist):
        return tolist()
    return str(x)


def write_table(directory: Path, name: str, table: pa.Table, row: str = "", *,
                shape: tuple[int, int, int] | None = None, **fields: Any) -> dict[str, Any]:
    """Write ``table`` as ``directory/name`` (zstd Parquet, :func:`write_parquet`); return its manifest entry."""
    path = directory / name
    write_parquet(path, table, row or f"a row of {name}", shape=shape, **fields)
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
        manifest = _jsonl.read_json(path, "a manifest")
    except ValidationError as exc:
        raise IntegrityError(f"{exc.detail}; the file is truncated or corrupt", source=str(path)) from None
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
            raise ValidationError(f"must be a positive integer; got {_short(value)}", source=str(path), field=key)
    check_model_shape(manifest["n_layers"], manifest["n_experts"], manifest["top_k"], source=str(path))
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        raise IntegrityError("no 'files' table", source=str(path), field="files")
    for name in files:
        inside(directory, name, str(path), "files")
    return manifest


#: Bounds on a model's shape (docs/safety.md), defined beside the JSON Lines checks that use them too.
MAX_LAYERS, MAX_EXPERTS, MAX_BLOCKS = _jsonl.MAX_LAYERS, _jsonl.MAX_EXPERTS, _jsonl.MAX_BLOCKS


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, int) or abs(value) < 10 ** 30 else f"an integer of {len(str(abs(value)))} digits"
    return text if len(text) <= 80 else text[:77] + "..."


def check_model_shape(n_layers: Any, n_experts: Any, top_k: Any, *, source: str | None = None,
                      names: tuple[str, str, str] = ("n_layers", "n_experts", "top_k")) -> None:
    """Check ``L, N, k`` are integers within the supported bounds (:data:`MAX_LAYERS`, ...).

    Raises
    ------
    ValidationError
        Naming the offending field (``names`` gives how the caller calls them, e.g. ``--layers``).
    """
    import numbers

    for name, value, hi in zip(names, (n_layers, n_experts, top_k), (MAX_LAYERS, MAX_EXPERTS, MAX_EXPERTS),
                               strict=True):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValidationError(f"must be a positive integer; got {_short(value)}", source=source, field=name)
        if value > hi:
            raise ValidationError(f"at most {hi} are supported; got {_short(value)}", source=source, field=name)
    if top_k > n_experts:
        raise ValidationError(f"must be <= {names[1]} ({n_experts}); got {top_k}", source=source, field=names[2])
    if int(n_layers) * int(n_experts) > MAX_BLOCKS:
        raise ValidationError(f"{names[0]} x {names[1]} = {int(n_layers) * int(n_experts):,} blocks exceeds the "
                              f"supported {MAX_BLOCKS:,}", source=source, field=names[1])


def inside(directory: str | os.PathLike[str], name: Any, source: str, field: str) -> Path:
    """``directory / name`` for a file name read from a manifest, refusing one that leaves the directory.

    An absolute path, a ``..`` component, a backslash or NUL, or a symbolic link that resolves outside
    ``directory`` is refused: a manifest can only point at files it sits beside.
    """
    if not isinstance(name, str) or not name or "\x00" in name or "\\" in name:
        raise ValidationError(f"expected a relative file name; got {_short(name)}", source=source, field=field)
    rel = Path(name)
    if rel.is_absolute() or name.startswith("/") or any(part in ("..", "") for part in name.split("/")) \
            or rel.drive:
        raise ValidationError(f"file name {name!r} leaves the directory (absolute or '..'); a manifest may "
                              "only name files inside its own directory", source=source, field=field)
    base = Path(directory)
    target = base / rel
    try:
        real_base = base.resolve()
        real = target.resolve()
    except (OSError, RuntimeError):
        raise ValidationError(f"file name {name!r} cannot be resolved (a symbolic link loop?)", source=source,
                              field=field) from None
    if real != real_base and real_base not in real.parents:
        raise ValidationError(f"file {name!r} is a symbolic link leaving the directory; a manifest may only "
                              "name files inside its own directory", source=source, field=field)
    return target


def _checked_file(directory: Path, manifest: dict[str, Any], name: str) -> tuple[Path, dict[str, Any]]:
    """``name``'s path and manifest entry, after the checks that need no decoding: listed, inside the
    directory, present, sha256, footer rows and size."""
    entry = manifest["files"].get(name)
    path = inside(directory, name, str(directory / MANIFEST), "files")
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
    _check_parquet_size(path, entry.get("rows"))
    return path, entry


def open_table(directory: str | os.PathLike[str], manifest: dict[str, Any], name: str) -> pq.ParquetFile:
    """``name`` opened for reading column by column, after the checks that need no decoding (listed, present,
    sha256, footer rows and size); a reader decodes it a column and a batch of rows at a time, never the whole
    table at once (``read_trace``, ``read_events``)."""
    path, _ = _checked_file(Path(directory), manifest, name)
    try:
        return pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)     # streamed: no whole-file buffer
    except (pa.ArrowInvalid, OSError) as exc:
        raise IntegrityError(f"not a readable Parquet file ({exc})", source=str(path)) from None


#: A Parquet file may decode to at most this many bytes plus :data:`MAX_PARQUET_EXPANSION` times its size.
MAX_PARQUET_FLOOR = 256 << 20
MAX_PARQUET_EXPANSION = 100
_PHYSICAL_WIDTH = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}


def _check_parquet_size(path: Path, rows: Any) -> None:
    """Refuse a Parquet file whose footer declares other rows than the manifest, or that would decode to far
    more memory than its size suggests (a run-length "bomb"), before any column is read."""
    try:
        md = pq.ParquetFile(path).metadata
    except (pa.ArrowInvalid, OSError) as exc:
        raise IntegrityError(f"not a readable Parquet file ({exc})", source=str(path)) from None
    if md.num_rows != rows:
        raise IntegrityError(f"expected {rows} rows; the file declares {md.num_rows}", source=str(path))
    decoded = 0
    for g in range(md.num_row_groups):
        group = md.row_group(g)
        for c in range(group.num_columns):
            col = group.column(c)
            decoded += col.num_values * _PHYSICAL_WIDTH.get(col.physical_type, 8) + max(col.total_uncompressed_size, 0)
    limit = MAX_PARQUET_FLOOR + MAX_PARQUET_EXPANSION * path.stat().st_size
    if decoded > limit:
        raise IntegrityError(f"declares about {decoded:,} bytes of data in a {path.stat().st_size:,}-byte file "
                             f"(more than {MAX_PARQUET_EXPANSION}-fold plus {MAX_PARQUET_FLOOR >> 20} MiB); refused "
                             "before reading", source=str(path))


def require_columns(table: pa.Table, columns: dict[str, str], source: str) -> None:
    """Check that ``table`` has each column, by name; ``columns`` maps name -> description."""
    for name, what in columns.items():
        if name not in table.column_names:
            raise ValidationError(f"missing column ({what})", source=source, field=name)


# ----------------------------------------------------------------------------- the one-writer lock
LOCK = ".lock"


def _lock_fd(fd: int) -> None:
    """Take an exclusive, non-blocking lock on ``fd``; raise OSError if another process holds it.

    A POSIX record lock (``fcntl.lockf``): it belongs to the process that took it, is *not* inherited
    by forked workers, and the OS releases it when that process ends, however it ends (SIGKILL too),
    so a lock whose holder is gone is free again. ``msvcrt.locking`` on Windows.
    """
    try:
        import fcntl
    except ImportError:
        fcntl = None  # type: ignore[assignment]
    if fcntl is not None:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    try:
        import msvcrt
    except ImportError:
        raise ValidationError("this platform has neither fcntl nor msvcrt file locks, which are needed to keep "
                              "two runs from writing one directory at once; run on Linux, macOS or Windows") from None
    os.lseek(fd, 0, os.SEEK_SET)
    msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def lock_holder(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The holder recorded in ``directory/.lock`` (``pid``, ``host``, ``since``), or ``{}``."""
    try:
        with open(Path(directory) / LOCK, "rb") as fh:
            body = json.loads(fh.read(4096).decode("utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


@contextlib.contextmanager
def exclusive_lock(directory: str | os.PathLike[str], what: str) -> Iterator[None]:
    """Hold ``directory/.lock`` for the duration: one writer at a time, with its pid and host recorded.

    Parameters
    ----------
    directory
        An existing directory.
    what
        How the error names the directory ("result store", "collection").

    Raises
    ------
    ValidationError
        Another live process holds the lock (its pid and host are named). A lock whose holder died
        is released by the OS and simply taken over; a holder recorded on this host that is no
        longer running is waited for briefly (the OS releases its lock as it exits).

    Notes
    -----
    POSIX locks are released when the holding process closes *any* descriptor of the file, so
    nothing else in the holding process may open ``.lock`` (:func:`lock_holder` is for the others).
    """
    directory = Path(directory)
    path = directory / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + 5.0
        while True:
            try:
                _lock_fd(fd)
                break
            except OSError:
                holder = lock_holder(directory)
                pid, host = holder.get("pid"), holder.get("host")
                gone = (host == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid))
                if gone and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                who = (f"pid {pid} on {host}" + (", no longer running" if gone else "")
                       if pid is not None else "holder unknown")
                raise ValidationError(f"another run holds this {what}'s lock ({who}); wait for it to finish or "
                                      f"use another directory", source=str(directory)) from None
        body = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": round(time.time(), 3)})
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (body + "\n").encode())
        try:
            yield
        finally:
            with contextlib.suppress(OSError):      # released cleanly: an empty lock file, the same bytes each run
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- bounded .npy / .npz reading
#: The most bytes one array read from an ``.npy``/``.npz`` may declare unless the caller allows more.
MAX_ARRAY_BYTES = 16 << 30
#: A compressed ``.npz`` member may expand to at most this many times its stored size (a zip bomb is refused).
MAX_COMPRESSION_RATIO = 200


def _npy_header(fh, source: str, field: str) -> tuple[tuple[int, ...], bool, Any, int]:
    """Read an ``.npy`` header from ``fh``: shape, fortran order, dtype, header length in bytes."""
    import numpy as np

    fmt = np.lib.format
    try:
        version = fmt.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(fh, max_header_size=10000)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = fmt.read_array_header_2_0(fh, max_header_size=10000)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except (ValueError, SyntaxError, OverflowError, EOFError) as exc:
        raise ValidationError(f"not a readable .npy array header ({exc})", source=source, field=field) from None
    if dtype.hasobject:
        raise ValidationError("object arrays are never loaded (they would need pickle)", source=source,
                              field=field)
    return tuple(int(x) for x in shape), bool(fortran), dtype, int(fh.tell())


def _check_declared(shape, dtype, header_len: int, present: int, source: str, field: str,
                    expect_shape, expect_dtypes, max_bytes: int) -> int:
    import math

    nbytes = math.prod(shape) * dtype.itemsize
    if expect_shape is not None:
        want = tuple(expect_shape)
        if len(want) != len(shape) or any(w is not None and w != s for w, s in zip(want, shape, strict=True)):
            shown = tuple("*" if w is None else w for w in want)
            raise ValidationError(f"declares shape {shape}; expected {shown}", source=source, field=field)
    if expect_dtypes is not None and dtype.kind + str(dtype.itemsize) not in expect_dtypes \
            and dtype.name not in expect_dtypes:
        raise ValidationError(f"declares dtype {dtype}; expected one of {', '.join(sorted(expect_dtypes))}",
                              source=source, field=field)
    if nbytes > max_bytes:
        raise ValidationError(f"declares {shape} {dtype} = {nbytes:,} bytes, over the bound of {max_bytes:,}",
                              source=source, field=field)
    if present != header_len + nbytes:
        raise ValidationError(f"declares {shape} {dtype} ({nbytes:,} bytes of data) but holds "
                              f"{max(present - header_len, 0):,}; the file is truncated or crafted",
                              source=source, field=field)
    return nbytes


def read_npy(path: str | os.PathLike[str], *, expect_shape=None, expect_dtypes=None,
             max_bytes: int = MAX_ARRAY_BYTES, mmap: bool = False):
    """Load an ``.npy`` array after checking its declared shape and dtype against the bytes present.

    ``expect_shape`` may hold ``None`` for free dimensions; ``expect_dtypes`` names allowed dtypes
    (``"float16"`` or kind+size such as ``"f2"``). Nothing is allocated before the checks pass.
    """
    import numpy as np

    src = str(path)
    try:
        with open(path, "rb") as fh:
            shape, fortran, dtype, header_len = _npy_header(fh, src, None)
            size = os.fstat(fh.fileno()).st_size
    except OSError as exc:
        raise ValidationError(f"cannot read ({exc.strerror or exc})", source=src) from None
    _check_declared(shape, dtype, header_len, size, src, None, expect_shape, expect_dtypes, max_bytes)
    try:
        return np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except (OSError, ValueError, EOFError) as exc:
        raise ValidationError(f"not a readable .npy file ({exc})", source=src) from None


def read_npz(path: str | os.PathLike[str], *, expect: dict[str, tuple[Any, Any]] | None = None,
             max_bytes: int = MAX_ARRAY_BYTES, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Load every array of an ``.npz`` archive, checking each member's declared size before reading it.

    Parameters
    ----------
    path
        The archive.
    expect
        Per member name, ``(shape, dtypes)`` as for :func:`read_npy` (either may be ``None``).
    max_bytes
        Bound on the declared bytes of all members together.
    required
        Member names (without ``.npy``) that must be present.

    Raises
    ------
    ValidationError
        Not a zip archive, a member that is not a plain ``.npy``, an object array, a declared shape
        whose data is not present (truncated or crafted), a member over the bounds or a compression
        ratio over :data:`MAX_COMPRESSION_RATIO`.
    """
    import zipfile

    import numpy as np

    src = str(path)
    expect = expect or {}
    out: dict[str, Any] = {}
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        raise ValidationError(f"not an .npz archive ({exc})", source=src) from None
    with zf:
        infos = zf.infolist()
        if len(infos) > 1000:
            raise ValidationError(f"holds {len(infos)} members; an .npz of this tool holds a handful", source=src)
        total = 0
        plan = []
        for info in infos:
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if not info.filename.endswith(".npy") or "/" in name or name in out:
                raise ValidationError(f"unexpected member {info.filename!r}; expected NAME.npy arrays", source=src)
            if info.compress_type != zipfile.ZIP_STORED and \
                    info.file_size > MAX_COMPRESSION_RATIO * max(info.compress_size, 1) + (1 << 20):
                raise ValidationError(f"member expands {info.file_size / max(info.compress_size, 1):,.0f}-fold; "
                                      f"at most {MAX_COMPRESSION_RATIO}-fold is read", source=src, field=name)
            try:
                with zf.open(info) as fh:
                    shape, _, dtype, header_len = _npy_header(fh, src, name)
            except (OSError, zipfile.BadZipFile, EOFError, RuntimeError) as exc:
                raise ValidationError(f"unreadable member ({exc})", source=src, field=name) from None
            e_shape, e_dtypes = expect.get(name, (None, None))
            total += _check_declared(shape, dtype, header_len, info.file_size, src, name, e_shape, e_dtypes,
                                     max_bytes)
            if total > max_bytes:
                raise ValidationError(f"members declare {total:,} bytes together, over the bound of "
                                      f"{max_bytes:,}", source=src, field=name)
            plan.append((name, info))
        missing = [r for r in required if r not in {n for n, _ in plan}]
        if missing:
            raise ValidationError(f"lacks the array {missing[0]!r}", source=src, field=missing[0])
        for name, info in plan:
            try:
                with zf.open(info) as fh:
                    out[name] = np.lib.format.read_array(fh, allow_pickle=False)
            except (OSError, ValueError, zipfile.BadZipFile, EOFError, RuntimeError) as exc:
                raise ValidationError(f"unreadable member ({exc})", source=src, field=name) from None
    return out
