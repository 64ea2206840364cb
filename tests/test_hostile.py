"""The safety contract under hostile input (docs/safety.md).

Every reader is fed truncated, mistyped, oversized and crafted files; every case must end in exit
status 2 (or a ``ValidationError`` for library readers) with one line that names the file (and the
record or field where there is one), write nothing, and finish in bounded time and memory. Writers
must never replace what they did not write, honour the umask and name the file on a full disk. The
spec kill test (SIGKILL of ``spec run --jobs 2`` then an immediate resume) lives at the end.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import route_records, write_jsonl

from expertcache.cli import main
from expertcache.errors import ValidationError
from expertcache.storage import sha256_file

SECONDS = 8.0               # a few seconds on a loaded 2-core machine
PEAK_BYTES = 256 << 20      # Python-side allocations (numpy included) while one case runs
SRC = str(Path(__file__).resolve().parents[1] / "src")
MARKER = ".expertcache-output"     # expertcache.storage.MARKER, spelled out so this file runs against older code


# ----------------------------------------------------------------------------- helpers
def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its size and mtime: 'nothing written' is an unchanged snapshot."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[p.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def bounded(fn):
    """Run ``fn()`` under tracemalloc; assert the time and peak bounds; return its result."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        result = fn()
    finally:
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert elapsed < SECONDS, f"took {elapsed:.1f} s"
    assert peak < PEAK_BYTES, f"peak {peak / 2**20:.0f} MiB"
    return result


def refuse(root: Path, args: list[str], *fragments: str) -> str:
    """Invoke the CLI: exit 2, one ``error:`` line holding ``fragments``, nothing written under ``root``."""
    before = snapshot(root)
    res = bounded(lambda: CliRunner().invoke(main, [str(a) for a in args]))
    lines = [x for x in res.output.strip().splitlines() if x.strip()]
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert len(lines) == 1, res.output
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in res.output
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])
    assert snapshot(root) == before, "something was written"
    return lines[0]


def refuse_call(root: Path, fn, *fragments: str) -> str:
    """A library reader: one ValidationError whose one-line message holds ``fragments``; nothing written."""
    before = snapshot(root)

    def run():
        with pytest.raises(ValidationError) as info:
            fn()
        return str(info.value)

    msg = bounded(run)
    assert "\n" not in msg, msg
    for frag in fragments:
        assert frag in msg, (frag, msg)
    assert snapshot(root) == before
    return msg


def rewrite_table(directory: Path, name: str, table: pa.Table, **manifest_updates) -> None:
    """Replace ``directory/name`` with ``table`` and make the manifest's hash and row count match it."""
    pq.write_table(table, directory / name)
    m = json.loads((directory / "manifest.json").read_text())
    m["files"][name] = {"sha256": sha256_file(directory / name), "rows": table.num_rows}
    m.update(manifest_updates)
    (directory / "manifest.json").write_text(json.dumps(m))


def edit_manifest(directory: Path, **updates) -> None:
    m = json.loads((directory / "manifest.json").read_text())
    m.update(updates)
    (directory / "manifest.json").write_text(json.dumps(m))


def set_column(table: pa.Table, name: str, array) -> pa.Table:
    return table.set_column(table.column_names.index(name), name, array)


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    from expertcache.events import build_events
    from expertcache.trace import read_trace, select_requests
    from expertcache.trace.examples import example_trace

    root = tmp_path_factory.mktemp("hostile_base")
    tr = select_requests(example_trace(), range(4))
    tr.save(root / "trace")
    build_events(read_trace(root / "trace"), 2).save(root / "stream")
    return root


@pytest.fixture
def trace_dir(base, tmp_path) -> Path:
    shutil.copytree(base / "trace", tmp_path / "t")
    return tmp_path / "t"


@pytest.fixture
def stream_dir(base, tmp_path) -> Path:
    shutil.copytree(base / "stream", tmp_path / "s")
    return tmp_path / "s"


# ============================================================================= data loss: --overwrite
def _thesis(tmp_path: Path) -> Path:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("x")
    return mine


def test_overwrite_never_deletes_a_directory_this_tool_did_not_write(tmp_path, routes_file):
    mine = _thesis(tmp_path)
    refuse(tmp_path, ["trace", "import", routes_file, "-L", "2", "-N", "6", "-k", "2", "-o", mine, "--overwrite"],
           str(mine), "not a directory written by expertcache")
    assert (mine / "thesis.tex").read_text() == "x"


def test_overwrite_of_events_probe_and_report_outputs_follows_the_same_rule(tmp_path, trace_dir, stream_dir):
    mine = _thesis(tmp_path)
    refuse(tmp_path, ["events", "build", trace_dir, "--batch", "2", "-o", mine, "--overwrite"], "not a directory")
    refuse(tmp_path, ["report", stream_dir, "-o", mine, "--overwrite", "--no-figures"], "not a directory")
    refuse(tmp_path, ["probe", "build", "-o", mine, "--overwrite"], "not a directory")
    assert (mine / "thesis.tex").read_text() == "x"


@pytest.mark.parametrize("target", ["/", "."])
def test_overwrite_of_the_root_or_the_working_directory_is_refused(tmp_path, routes_file, target, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before, root_before = sorted(os.listdir(tmp_path)), set(os.listdir("/"))
    refuse(tmp_path, ["trace", "import", routes_file, "-L", "2", "-N", "6", "-k", "2", "-o", target, "--overwrite"],
           "never replaced")
    assert sorted(os.listdir(tmp_path)) == before
    assert set(os.listdir("/")) == root_before         # no ..XXXX.old left in / either


def test_overwrite_refuses_a_file_and_a_symlink(tmp_path, routes_file):
    f = tmp_path / "notes.txt"
    f.write_text("keep")
    refuse(tmp_path, ["trace", "import", routes_file, "-L", "2", "-N", "6", "-k", "2", "-o", f, "--overwrite"],
           "is a file")
    mine = _thesis(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(mine)
    refuse(tmp_path, ["trace", "import", routes_file, "-L", "2", "-N", "6", "-k", "2", "-o", link, "--overwrite"],
           "symbolic link")
    assert f.read_text() == "keep" and (mine / "thesis.tex").exists()


def test_overwrite_replaces_a_directory_this_tool_wrote(tmp_path, routes_file):
    out = tmp_path / "t"
    args = ["trace", "import", str(routes_file), "-L", "2", "-N", "6", "-k", "2", "-o", str(out)]
    assert CliRunner().invoke(main, args).exit_code == 0
    assert (out / MARKER).is_file()
    res = CliRunner().invoke(main, [*args, "--overwrite"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["routes.jsonl", "t"]     # no .old, no .tmp left
    (out / MARKER).unlink()                 # an older output: its manifest says it is ours
    assert CliRunner().invoke(main, [*args, "--overwrite"]).exit_code == 0


def test_file_outputs_are_never_replaced_without_overwrite(tmp_path, stream_dir):
    from expertcache.events import read_events
    from expertcache.nextuse import LinearNextUse, access_features

    model = tmp_path / "m.json"
    LinearNextUse.fit(access_features(read_events(stream_dir))).save(model)
    for path, args in ((tmp_path / "fit.json", ["nextuse", "fit", stream_dir, "-o", tmp_path / "fit.json"]),
                       (tmp_path / "adv.npz", ["nextuse", "eval", model, stream_dir, "--advice-out",
                                              tmp_path / "adv.npz"]),
                       (tmp_path / "p.svg", ["replay", stream_dir, "--plot", tmp_path / "p.svg"])):
        path.write_text("precious")
        refuse(tmp_path, args, str(path), "already exists")
        assert path.read_text() == "precious"
    res = CliRunner().invoke(main, ["nextuse", "fit", str(stream_dir), "-o", str(tmp_path / "fit.json"),
                                    "--overwrite"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "fit.json").read_text())["kind"] == "linear"


def test_a_full_disk_names_the_output_and_keeps_nothing(tmp_path, stream_dir, monkeypatch):
    out = tmp_path / "fit.json"
    out.write_text("old model")

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)       # the write of the temporary file fails as on a full disk
    line = refuse(tmp_path, ["nextuse", "fit", stream_dir, "-o", out, "--overwrite"], str(out), "No space left")
    assert "free some space" in line
    assert out.read_text() == "old model"


def test_outputs_honour_the_umask(tmp_path, routes_file):
    old = os.umask(0o022)
    try:
        out = tmp_path / "t"
        assert CliRunner().invoke(main, ["trace", "import", str(routes_file), "-L", "2", "-N", "6", "-k", "2",
                                         "-o", str(out)]).exit_code == 0
        from expertcache.storage import atomic_write_bytes

        atomic_write_bytes(tmp_path / "f.json", b"{}")
    finally:
        os.umask(old)
    assert (out.stat().st_mode & 0o777) == 0o755
    assert ((out / "routes.parquet").stat().st_mode & 0o777) == 0o644
    assert ((tmp_path / "f.json").stat().st_mode & 0o777) == 0o644


def test_a_closed_pipe_exits_quietly(base):
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-c", "from expertcache.cli import main; main()", "trace", "info",
                             str(base / "trace"), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()                     # the reader is gone before the first byte is written
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert err == "", err
    assert proc.returncode != 2


def test_nextuse_fit_row_bound_is_validated(stream_dir, tmp_path):
    refuse(tmp_path, ["nextuse", "fit", stream_dir, "-o", tmp_path / "m.json", "--max-rows", "-5"], "max_rows")


@pytest.mark.parametrize("rho", ["0:1:1e-9", "0:1:0", "0:inf:1", "0.5,2", "0:1.5:0.5"])
def test_rho_lists_are_bounded_before_they_are_built(stream_dir, tmp_path, rho):
    refuse(tmp_path, ["replay", stream_dir, "--rho", rho], "--rho")


# ============================================================================= trace directories
def _routes(trace_dir: Path) -> pa.Table:
    return pq.read_table(trace_dir / "routes.parquet")


def _experts_as(t: pa.Table, values: np.ndarray, typ) -> pa.Table:
    k = t.schema.field("experts").type.list_size
    return set_column(t, "experts", pa.FixedSizeListArray.from_arrays(pa.array(values, typ), k))


def test_trace_expert_ids_beyond_int16_are_not_wrapped(trace_dir, tmp_path):
    t = _routes(trace_dir)
    flat = t["experts"].combine_chunks().flatten().to_numpy().astype(np.int64)
    flat[5] += 65536
    rewrite_table(trace_dir, "routes.parquet", _experts_as(t, flat, pa.int64()))
    refuse(tmp_path, ["trace", "info", trace_dir], "routes.parquet", "field 'experts'", "got 655")


def _list_column(t: pa.Table, name: str, case: str) -> pa.Array:
    """A crafted list column ``name`` of ``t``: its values with one fault (:func:`test_list_columns_are_checked`)."""
    col = t[name].combine_chunks()
    k = col.type.list_size
    flat = col.flatten().to_numpy(zero_copy_only=False).copy()
    if case == "null row":
        rows = [None if i == 7 else flat[i * k:(i + 1) * k].tolist() for i in range(len(col))]
        return pa.array(rows, pa.list_(col.type.value_type, k))
    if case == "null entry":
        vals = flat.tolist()
        vals[3 * k + 2] = None
        return pa.FixedSizeListArray.from_arrays(pa.array(vals, col.type.value_type), k)
    if case == "size":
        wide = np.concatenate([flat.reshape(-1, k), flat.reshape(-1, k)[:, :1]], axis=1).ravel()
        return pa.FixedSizeListArray.from_arrays(pa.array(wide, col.type.value_type), k + 1)
    if case == "length":
        rows = [flat[i * k:(i + 1) * k - (i == 5)].tolist() for i in range(len(col))]
        return pa.array(rows, pa.list_(col.type.value_type))
    if case == "flat":
        return pa.array(flat[:len(col)], col.type.value_type)
    assert case == "id", case
    flat[9 * k + 1] = 128                                  # past any N the test traces have
    return pa.FixedSizeListArray.from_arrays(pa.array(flat, col.type.value_type), k)


@pytest.mark.parametrize("name,case,fragments", [
    ("experts", "null row", ("null", "record 8")),
    ("experts", "null entry", ("null", "record 4")),
    ("experts", "size", ("top_k=",)),
    ("experts", "length", ("entries (top_k)", "record 6")),
    ("experts", "flat", ("expected a list column",)),
    ("experts", "id", ("expert id must be in", "got 128", "record 10")),
    ("gates", "null entry", ("field 'gates'", "null", "record 4")),
    ("gates", "length", ("field 'gates'", "record 6")),
])
@pytest.mark.parametrize("read_rows", [None, 3])
def test_list_columns_are_checked(trace_dir, tmp_path, monkeypatch, name, case, fragments, read_rows):
    """Each fault of a list column (a null row or entry, a list of another size or length, no list, an id out of
    range) is refused in one line naming the first faulty record, read in one chunk or in chunks of 3 rows."""
    if read_rows is not None:
        monkeypatch.setattr("expertcache.trace.model._READ_ROWS", read_rows)
    t = _routes(trace_dir)
    rewrite_table(trace_dir, "routes.parquet", set_column(t, name, _list_column(t, name, case)))
    refuse(tmp_path, ["trace", "info", trace_dir], "routes.parquet", f"field '{name}'", *fragments)


def test_trace_nan_expert_ids_are_not_read_as_zero(trace_dir, tmp_path):
    t = _routes(trace_dir)
    flat = t["experts"].combine_chunks().flatten().to_numpy().astype(np.float64)
    flat[3] = np.nan
    rewrite_table(trace_dir, "routes.parquet", _experts_as(t, flat, pa.float64()))
    refuse(tmp_path, ["trace", "info", trace_dir], "field 'experts'", "integer")


def test_trace_positions_beyond_int32_do_not_wrap(trace_dir, tmp_path):
    t = _routes(trace_dir)
    pos = t["position"].to_numpy().astype(np.int64) + 2 ** 32
    rewrite_table(trace_dir, "routes.parquet", set_column(t, "position", pa.array(pos, pa.int64())))
    refuse(tmp_path, ["trace", "info", trace_dir], "field 'position'", "2147483648")


def test_trace_null_request_ids_are_refused(trace_dir, tmp_path):
    t = _routes(trace_dir)
    ids = t["request_id"].combine_chunks().cast(pa.string()).to_pylist()
    ids[0] = None
    rewrite_table(trace_dir, "routes.parquet", set_column(t, "request_id", pa.array(ids, pa.string())))
    refuse(tmp_path, ["trace", "info", trace_dir], "field 'request_id'", "null", "record 1")


@pytest.mark.parametrize("column,value,fragment", [
    ("position", None, "null"),
    ("layer", "x", "integer"),
    ("phase", "warmup", "'prefill' or 'decode'"),
])
def test_trace_columns_are_typed(trace_dir, tmp_path, column, value, fragment):
    t = _routes(trace_dir)
    if column == "layer":
        arr = pa.array([value] * t.num_rows, pa.string())
    elif column == "phase":
        vals = t["phase"].combine_chunks().cast(pa.string()).to_pylist()
        vals[4] = value
        arr = pa.array(vals, pa.string())
    else:
        vals = t[column].to_pylist()
        vals[2] = value
        arr = pa.array(vals, pa.int32())
    rewrite_table(trace_dir, "routes.parquet", set_column(t, column, arr))
    refuse(tmp_path, ["trace", "info", trace_dir], f"field '{column}'", fragment)


@pytest.mark.parametrize("column", ["position", "request_id", "token_id"])
def test_trace_per_token_columns_agree_across_layers(trace_dir, tmp_path, column):
    t = _routes(trace_dir)
    if column == "request_id":
        vals = t[column].combine_chunks().cast(pa.string()).to_pylist()
        vals[1] = vals[1] + "-other"
        arr = pa.array(vals, pa.string())
    else:
        vals = t[column].to_pylist()
        vals[1] = (vals[1] or 0) + 1
        arr = pa.array(vals, t.schema.field(column).type)
    rewrite_table(trace_dir, "routes.parquet", set_column(t, column, arr))
    refuse(tmp_path, ["trace", "info", trace_dir], f"field '{column}'", "differs between the layers", "record 2")


def test_trace_token_ids_beyond_int64_are_refused(trace_dir, tmp_path):
    t = _routes(trace_dir)
    rewrite_table(trace_dir, "routes.parquet",
                  set_column(t, "token_id", pa.array([2 ** 63] * t.num_rows, pa.uint64())))
    refuse(tmp_path, ["trace", "info", trace_dir], "field 'token_id'", "9223372036854775808")


@pytest.mark.parametrize("key,value,fragment", [
    ("n_experts", 2 ** 63 + 1, "64-bit"),
    ("n_experts", 40_000, "field 'n_experts'"),
    ("n_layers", 10 ** 9, "field 'n_layers'"),
    ("n_layers", 1e9, "field 'n_layers'"),
    ("top_k", 0, "field 'top_k'"),
    ("n_tokens", 7, "field 'n_tokens'"),
    ("n_requests", 99, "field 'n_requests'"),
])
def test_trace_manifest_values_are_bounded_and_checked_against_the_data(trace_dir, tmp_path, key, value, fragment):
    edit_manifest(trace_dir, **{key: value})
    refuse(tmp_path, ["trace", "info", trace_dir], fragment)


@pytest.mark.parametrize("body", ["[" * 100_000 + "]" * 100_000, '{"n_layers": ' + "9" * 5000 + "}",
                                  "\x00\xff", '{"kind": "routing_trace"'])
def test_trace_manifest_json_is_guarded(trace_dir, tmp_path, body):
    (trace_dir / "manifest.json").write_bytes(body.encode("utf-8", "surrogatepass") if body.isascii()
                                              else body.encode("latin-1"))
    refuse(tmp_path, ["trace", "info", trace_dir], "manifest.json")


@pytest.mark.parametrize("name", ["/etc/hostname", "../outside.parquet", "sub/../../x.parquet"])
def test_trace_manifest_file_names_stay_inside(trace_dir, tmp_path, name):
    m = json.loads((trace_dir / "manifest.json").read_text())
    m["files"][name] = m["files"].pop("routes.parquet")
    (trace_dir / "manifest.json").write_text(json.dumps(m))
    refuse(tmp_path, ["trace", "info", trace_dir], "leaves the directory")


def test_trace_manifest_symlink_leaving_the_directory_is_refused(trace_dir, tmp_path):
    outside = tmp_path / "elsewhere.parquet"
    shutil.move(trace_dir / "routes.parquet", outside)
    (trace_dir / "routes.parquet").symlink_to(outside)
    refuse(tmp_path, ["trace", "info", trace_dir], "symbolic link leaving the directory")


def test_trace_parquet_that_would_decode_to_gigabytes_is_refused_before_reading(trace_dir, tmp_path):
    """A run-length 'bomb': a few kilobytes declaring 2**28 rows; refused from the footer, nothing decoded."""
    path = trace_dir / "routes.parquet"
    chunk = pa.table({"layer": pa.array(np.zeros(1 << 22, np.int16))})
    with pq.ParquetWriter(path, chunk.schema, compression="zstd") as w:
        for _ in range(64):
            w.write_table(chunk)
    m = json.loads((trace_dir / "manifest.json").read_text())
    m["files"]["routes.parquet"] = {"sha256": sha256_file(path), "rows": 1 << 28}
    (trace_dir / "manifest.json").write_text(json.dumps(m))
    assert path.stat().st_size < 8 << 20
    refuse(tmp_path, ["trace", "info", trace_dir], "routes.parquet", "refused before reading")


def test_trace_parquet_footer_rows_must_match_the_manifest(trace_dir, tmp_path):
    m = json.loads((trace_dir / "manifest.json").read_text())
    m["files"]["routes.parquet"]["rows"] += 16
    (trace_dir / "manifest.json").write_text(json.dumps(m))
    refuse(tmp_path, ["trace", "info", trace_dir], "routes.parquet", "declares")


# ============================================================================= stream directories
def _events(stream_dir: Path) -> pa.Table:
    return pq.read_table(stream_dir / "events.parquet")


def test_stream_logical_must_be_active_times_k(stream_dir, tmp_path):
    t = _events(stream_dir)
    logical = t["logical"].to_numpy().copy()
    logical[0] += 5
    rewrite_table(stream_dir, "events.parquet", set_column(t, "logical", pa.array(logical, pa.int64())),
                  logical=int(logical.sum()))
    refuse(tmp_path, ["replay", stream_dir], "events.parquet", "record 1", "field 'logical'", "active * k")


def test_stream_multiplicities_must_sum_to_logical(stream_dir, tmp_path):
    t = _events(stream_dir)
    col = t["multiplicity"].combine_chunks()
    vals = col.flatten().to_numpy().copy()
    i = int(np.flatnonzero(vals > 1)[0])
    vals[i] -= 1
    arr = pa.ListArray.from_arrays(col.offsets, pa.array(vals, pa.int32()))
    rewrite_table(stream_dir, "events.parquet", set_column(t, "multiplicity", arr))
    refuse(tmp_path, ["replay", stream_dir], "field 'multiplicity'", "sum to logical")


@pytest.mark.parametrize("L,N", [(100_000, 30_000), (4000, 4000), (1, 40_000)])
def test_stream_manifest_shapes_are_bounded_before_allocating(stream_dir, tmp_path, L, N):
    edit_manifest(stream_dir, n_layers=L, n_experts=N)
    refuse(tmp_path, ["replay", stream_dir], "manifest.json")


@pytest.mark.parametrize("column,make,fragment", [
    ("step", lambda t: pa.array([None] + t["step"].to_pylist()[1:], pa.int64()), "null"),
    ("step", lambda t: pa.array(np.asarray(t["step"].to_numpy(), dtype=np.float64)), "integer"),
    ("active", lambda t: pa.array([0] + t["active"].to_pylist()[1:], pa.int32()), "active must be >= 1"),
    ("layer", lambda t: pa.array([2 ** 40] * t.num_rows, pa.int64()), "field 'layer'"),
    ("step", lambda t: pa.array([2 ** 63] * t.num_rows, pa.uint64()), "field 'step'"),
])
def test_stream_columns_are_typed_and_bounded(stream_dir, tmp_path, column, make, fragment):
    t = _events(stream_dir)
    rewrite_table(stream_dir, "events.parquet", set_column(t, column, make(t)))
    refuse(tmp_path, ["replay", stream_dir], fragment)


def test_stream_expert_ids_beyond_int16_are_not_wrapped(stream_dir, tmp_path):
    t = _events(stream_dir)
    col = t["experts"].combine_chunks()
    vals = col.flatten().to_numpy().astype(np.int32)
    vals[0] += 65536
    rewrite_table(stream_dir, "events.parquet",
                  set_column(t, "experts", pa.ListArray.from_arrays(col.offsets, pa.array(vals, pa.int32()))))
    refuse(tmp_path, ["replay", stream_dir], "field 'experts'", "got 655")


def test_stream_declared_counts_must_match(stream_dir, tmp_path):
    edit_manifest(stream_dir, n_events=3)
    refuse(tmp_path, ["replay", stream_dir], "field 'n_events'")


def test_stream_gate_mass_must_be_floats(stream_dir, tmp_path):
    t = _events(stream_dir)
    col = t["gate_mass"].combine_chunks()
    arr = pa.ListArray.from_arrays(col.offsets, pa.array(["x"] * len(col.flatten()), pa.string()))
    rewrite_table(stream_dir, "events.parquet", set_column(t, "gate_mass", arr))
    refuse(tmp_path, ["replay", stream_dir], "field 'gate_mass'")


def test_stream_manifest_file_outside_is_refused(stream_dir, tmp_path):
    m = json.loads((stream_dir / "manifest.json").read_text())
    m["files"]["/etc/passwd"] = m["files"].pop("events.parquet")
    (stream_dir / "manifest.json").write_text(json.dumps(m))
    refuse(tmp_path, ["replay", stream_dir], "leaves the directory")


# ============================================================================= JSON Lines: events and routes
EVENT = {"step": 0, "layer": 0, "experts": [1, 2], "active": 1}
DEEP = "[" * 200_000 + "]" * 200_000
HUGE_INT = "9" * 5000


def _events_import(tmp_path: Path, lines: list, *shape: str) -> list[str]:
    src = tmp_path / "ev.jsonl"
    src.write_bytes(b"".join((x if isinstance(x, bytes) else (x if isinstance(x, str) else json.dumps(x))
                              .encode("utf-8", "surrogatepass")) + b"\n" for x in lines))
    return ["events", "import", str(src), *(shape or ("-L", "2", "-N", "6", "-k", "2")), "-o", str(tmp_path / "o")]


@pytest.mark.parametrize("line,fragment", [
    (DEEP, "nesting"),
    ('{"step": ' + HUGE_INT + ', "layer": 0, "experts": [1], "active": 1}', "64-bit"),
    ('{"step": 9223372036854775808, "layer": 0, "experts": [1], "active": 1}', "64-bit"),
    ('{"step": 4611686018427387904, "layer": 0, "experts": [1], "active": 1}', "field 'step'"),
    ('{"step": 0, "layer": 0, "experts": [1], "active": 4294967296}', "field 'active'"),
    ('{"step": 0, "layer": 0, "experts": [40000], "active": 1}', "field 'experts'"),
    ('{"step": 0, "layer": 0, "experts": [1], "active": 1, "x": "\\ud800"}', "surrogate"),
    ('[1, 2]', "JSON object"),
    ('{"step": 0, "layer": 0, "experts": [1, 2], "active": 1, "multiplicity": [1, 2]}', "multiplicit"),
    ('{"step": 0, "layer": 0, "experts": [1], "active": 1, "gate_mass": [NaN]}', "field 'gate_mass'"),
    ('{"step": 0, "layer": 0, "experts": [1', "not valid JSON"),
    (b'{"step": 0, "layer": 0, "experts": [1], "active": 1, "x": "\xff"}', "UTF-8"),
    ('{"step": 0, "layer": 0, "experts": "' + "1" * 200_000 + '", "active": 1}', "field 'experts'"),
])
def test_event_jsonl_records_are_guarded(tmp_path, line, fragment):
    line_text = refuse(tmp_path, _events_import(tmp_path, [{**EVENT, "layer": 1}, line]), "ev.jsonl", "record 2",
                       fragment)
    assert len(line_text) < 400


@pytest.mark.parametrize("shape,fragment", [
    (("-L", "1000000000", "-N", "6", "-k", "2"), "--layers"),
    (("-L", "2", "-N", "40000", "-k", "2"), "--experts"),
    (("-L", "4096", "-N", "4096", "-k", "2"), "blocks"),
])
def test_event_import_shapes_are_bounded(tmp_path, shape, fragment):
    refuse(tmp_path, _events_import(tmp_path, [EVENT], *shape), fragment)


def test_event_jsonl_with_a_byte_order_mark_is_accepted(tmp_path):
    src = tmp_path / "ev.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + json.dumps(EVENT).encode() + b"\n")
    res = CliRunner().invoke(main, ["events", "import", str(src), "-L", "2", "-N", "6", "-k", "2",
                                    "-o", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output


def _routes_import(tmp_path: Path, records: list, L: str = "2") -> list[str]:
    src = tmp_path / "r.jsonl"
    src.write_bytes(b"".join((r if isinstance(r, bytes) else (r if isinstance(r, str) else json.dumps(r))
                              .encode("utf-8", "surrogatepass")) + b"\n" for r in records))
    return ["trace", "import", str(src), "-L", L, "-N", "6", "-k", "2", "-o", str(tmp_path / "o")]


def _rec(**kw) -> str:
    r = {"request_id": "a", "phase": "decode", "position": 0, "layer": 0, "experts": [0, 1], **kw}
    return json.dumps(r)


@pytest.mark.parametrize("line,fragment", [
    (_rec(position=2 ** 31), "field 'position'"),
    (_rec(token_id=2 ** 63), "64-bit"),
    (_rec(experts=[0, 32768]), "field 'experts'"),
    (_rec(experts=[0, 0]), "distinct"),
    (_rec(layer=2), "field 'layer'"),
    (_rec(gates=[float("nan"), 1.0]), "field 'gates'"),
    (_rec(request_id=None), "field 'request_id'"),
    (_rec(request_id="\\ud800").replace("\\\\ud800", "\\ud800"), "surrogate"),
    (DEEP, "nesting"),
    ('{"request_id": "a", "position": ' + HUGE_INT + "}", "64-bit"),
    (_rec(phase="warmup"), "field 'phase'"),
])
def test_routes_jsonl_records_are_guarded(tmp_path, line, fragment):
    refuse(tmp_path, _routes_import(tmp_path, [line]), "r.jsonl", "record 1", fragment)


def test_routes_import_with_a_billion_layers_is_refused_at_once(tmp_path):
    refuse(tmp_path, _routes_import(tmp_path, [_rec()], L="1000000000"), "--layers")


def test_routes_jsonl_with_a_byte_order_mark_is_accepted(tmp_path):
    src = write_jsonl(tmp_path / "r.jsonl", route_records())
    src.write_bytes(b"\xef\xbb\xbf" + src.read_bytes())
    res = CliRunner().invoke(main, ["trace", "import", str(src), "-L", "2", "-N", "6", "-k", "2",
                                    "-o", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output


# ============================================================================= advice .npz
def _npy_bytes(arr: np.ndarray, shape=None) -> bytes:
    import io

    buf = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(arr.dtype), "fortran_order": False,
              "shape": tuple(shape if shape is not None else arr.shape)}
    np.lib.format.write_array_header_1_0(buf, header)
    buf.write(arr.tobytes())
    return buf.getvalue()


def _zip(path: Path, members: dict[str, bytes], compress=zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compress) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _advice_cli(stream_dir: Path, adv: Path) -> list:
    return ["replay", stream_dir, "-p", "predicted-next-use", "--advice", adv]


@pytest.mark.parametrize("case,fragment", [
    ("huge_header", "1500000000"),
    ("object", "object arrays"),
    ("wrong_shape", "expected"),
    ("not_zip", "not an .npz"),
    ("truncated", "cannot read advice"),
    ("bomb", "fold"),
    ("not_npy", "unexpected member"),
    ("deep_provenance", "provenance"),
    ("float_next_use", "dtype"),
    ("empty", "none of next_use"),
    ("many_members", "members"),
    ("wide_next_use", "next_use must be in"),
])
def test_advice_npz_is_checked_before_allocating(stream_dir, tmp_path, case, fragment):
    from expertcache.events import read_events

    s = read_events(stream_dir)
    adv = tmp_path / "a.npz"
    good = np.zeros(s.union, dtype=np.int32)
    if case == "huge_header":              # a small file declaring 5.6 GiB
        _zip(adv, {"next_use.npy": _npy_bytes(good[:10], shape=(1_500_000_000,))})
    elif case == "object":
        _zip(adv, {"next_use.npy": _npy_bytes(np.zeros(0, dtype=np.int32)).replace(b"'<i4'", b"'|O' ")})
    elif case == "wrong_shape":
        _zip(adv, {"next_use.npy": _npy_bytes(good[:-1])})
    elif case == "not_zip":
        adv.write_bytes(b"no zip here")
    elif case == "truncated":
        _zip(adv, {"next_use.npy": _npy_bytes(good)})
        adv.write_bytes(adv.read_bytes()[:60])
    elif case == "bomb":
        _zip(adv, {"priority.npy": _npy_bytes(np.zeros((4000, 4000), np.float32))}, zipfile.ZIP_DEFLATED)
    elif case == "not_npy":
        _zip(adv, {"next_use.npy": _npy_bytes(good), "evil.pkl": b"cos\nsystem\n"})
    elif case == "deep_provenance":
        _zip(adv, {"next_use.npy": _npy_bytes(good), "provenance.npy": _npy_bytes(np.array("[" * 100_000))})
    elif case == "float_next_use":
        _zip(adv, {"next_use.npy": _npy_bytes(good.astype(np.float64))})
    elif case == "empty":
        _zip(adv, {"provenance.npy": _npy_bytes(np.array("{}"))})
    elif case == "wide_next_use":             # int64 values that an int32 cast would wrap
        _zip(adv, {"next_use.npy": _npy_bytes(good.astype(np.int64) + 2 ** 40)})
    elif case == "many_members":
        _zip(adv, {f"m{i}.npy": _npy_bytes(np.zeros(1, np.int8)) for i in range(1001)})
    refuse(tmp_path, _advice_cli(stream_dir, adv), "a.npz", fragment)


# ============================================================================= next-use models
def _gbt(path: Path, **over) -> Path:
    """A valid one-tree model (root split on feature 0, two leaves), with fields replaced by ``over``."""
    from expertcache.nextuse.features import FEATURE_NAMES

    arrays = {"kind": np.array("gbt"), "features": np.array(FEATURE_NAMES), "init": np.array(1.0),
              "learning_rate": np.array(0.1), "tree_offsets": np.array([0, 3]), "left": np.array([1, -1, -1]),
              "right": np.array([2, -1, -1]), "feature": np.array([0, -2, -2]),
              "threshold": np.array([0.5, -2.0, -2.0]), "value": np.array([0.0, 1.0, 2.0])}
    arrays.update(over)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


def test_a_valid_crafted_tree_model_predicts(stream_dir, tmp_path):
    res = CliRunner().invoke(main, ["nextuse", "eval", str(_gbt(tmp_path / "m.npz")), str(stream_dir), "--json"])
    assert res.exit_code == 0, res.output


def _chain(depth: int) -> dict:
    n = 2 * depth + 1
    left, right = np.full(n, -1), np.full(n, -1)
    for d in range(depth):
        left[2 * d], right[2 * d] = 2 * d + 1, 2 * d + 2
    return {"tree_offsets": np.array([0, n]), "left": left, "right": right,
            "feature": np.where(left >= 0, 0, -2), "threshold": np.zeros(n), "value": np.zeros(n)}


@pytest.mark.parametrize("over,fragment", [
    ({"left": np.array([0, -1, -1]), "right": np.array([0, -1, -1])}, "no cycles"),       # the infinite loop
    ({"left": np.array([1, -1, -1]), "right": np.array([7, -1, -1])}, "field 'right'"),
    ({"feature": np.array([99, -2, -2])}, "feature"),
    ({"threshold": np.array([np.nan, 0.0, 0.0])}, "threshold"),
    ({"value": np.array([0.0, np.inf, 0.0])}, "field 'value'"),
    ({"tree_offsets": np.array([0, 2])}, "tree_offsets"),
    ({"left": np.array([1, -1])}, "one per node"),
    ({"init": np.array([1.0, 2.0])}, "field 'init'"),
    (_chain(70), "deeper than"),
    ({"left": np.array([1.5, -1, -1])}, "integer"),
    ({"kind": np.array("linear")}, "not a boosted-tree"),
])
def test_crafted_tree_models_are_refused_at_load(stream_dir, tmp_path, over, fragment):
    refuse(tmp_path, ["nextuse", "eval", _gbt(tmp_path / "m.npz", **over), stream_dir], "m.npz", fragment)


@pytest.mark.parametrize("body,fragment", [
    (DEEP, "nesting"),
    ('{"kind": "linear", "intercept": ' + HUGE_INT + "}", "64-bit"),
    ("not json", "not valid JSON"),
    ("LINEAR_WRONG_LEN", "field 'coef'"),
    ("LINEAR_NAN", "field 'mean'"),
])
def test_crafted_linear_models_are_refused_at_load(stream_dir, tmp_path, body, fragment):
    from expertcache.nextuse.features import FEATURE_NAMES

    d = len(FEATURE_NAMES)
    good = {"kind": "linear", "features": list(FEATURE_NAMES), "mean": [0.0] * d, "scale": [1.0] * d,
            "coef": [0.0] * d, "intercept": 0.0}
    if body == "LINEAR_WRONG_LEN":
        body = json.dumps({**good, "coef": [0.0] * (d + 1)})
    elif body == "LINEAR_NAN":
        body = json.dumps({**good, "mean": [float("nan")] * d})
    (tmp_path / "m.json").write_text(body)
    refuse(tmp_path, ["nextuse", "eval", tmp_path / "m.json", stream_dir], "m.json", fragment)


# ============================================================================= router checkpoints
def _routers(path: Path, L: int = 2, N: int = 4, d: int = 3, meta: dict | str | None = None, **tensors) -> Path:
    from safetensors.numpy import save_file

    t = {}
    for layer in range(L):
        for part in ("temporal", "spatio"):
            t[f"{part}.{layer}.weight"] = np.zeros((N, d), np.float32)
    t.update(tensors)
    info = meta if isinstance(meta, str) else json.dumps(meta or {"n_layers": L, "n_experts": N, "kind": "softmax"})
    path.mkdir(exist_ok=True)
    save_file(t, str(path / "routers.safetensors"), metadata={"expertcache": info})
    return path


def _load(path):
    from expertcache.routers.checkpoint import load_router_weights

    return load_router_weights(path)


def test_a_valid_router_file_loads(tmp_path):
    w = _load(_routers(tmp_path / "ck"))
    assert w.temporal_w.shape == (2, 4, 3)


@pytest.mark.parametrize("make,fragment", [
    (lambda p: _routers(p, meta={"n_layers": 10 ** 9}), "n_layers"),
    (lambda p: _routers(p, meta={"n_layers": "x"}), "n_layers"),
    (lambda p: _routers(p, meta={"n_layers": 3}), "declares 3 layers"),
    (lambda p: _routers(p, meta="[" * 100_000), "nesting"),
    (lambda p: _routers(p, meta="not json"), "not valid JSON"),
    (lambda p: _routers(p, meta={"n_layers": 2, "kind": "tanh"}), "kind"),
    (lambda p: _routers(p, **{"temporal.1.weight": np.zeros((5, 3), np.float32)}), "one shape"),
    (lambda p: _routers(p, **{"temporal.1.weight": np.zeros((4, 3), np.int32)}), "floats"),
    (lambda p: _routers(p, **{"temporal.0.bias": np.zeros(4, np.float32),
                              "temporal.1.bias": np.zeros(7, np.float32)}), "one shape"),
    (lambda p: (p.mkdir(), (p / "routers.safetensors").write_bytes(b"garbage"))[0], "cannot read router weights"),
    (lambda p: (p.mkdir(), (p / "routers.safetensors").write_bytes((2 ** 60).to_bytes(8, "little") + b"{}"))[0],
     "cannot read router weights"),
])
def test_crafted_router_files_are_refused(tmp_path, make, fragment):
    ck = tmp_path / "ck"
    make(ck)
    refuse_call(tmp_path, lambda: _load(ck), "routers.safetensors", fragment)


# ============================================================================= spec and criteria TOML
def _spec(tmp_path: Path, base: Path, body: str) -> Path:
    p = tmp_path / "spec.toml"
    p.write_text(body.replace("TRACE", str(base / "trace")))
    return p


GOOD_SPEC = '[inputs.a]\ntrace = "TRACE"\n[grid]\ninput = "a"\nbatch = 2\npolicy = "lru"\nrho = 0.5\n'


def test_a_good_spec_expands(tmp_path, base):
    res = CliRunner().invoke(main, ["spec", "expand", str(_spec(tmp_path, base, GOOD_SPEC))])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("edit,fragment", [
    (lambda s: s.replace("rho = 0.5", "rho = nan"), "rho"),
    (lambda s: s.replace("rho = 0.5", 'rho = "x"'), "rho"),
    (lambda s: s.replace("rho = 0.5", "rho = [0.1, \"a\"]"), "rho"),
    (lambda s: s.replace("batch = 2", "batch = " + HUGE_INT), "spec.toml"),
    (lambda s: s.replace("batch = 2", "batch = 1.5"), "batch"),
    (lambda s: s.replace("batch = 2", "batch = true"), "batch"),
    (lambda s: s.replace("batch = 2", "batch = -1"), "batch"),
    (lambda s: s.replace('policy = "lru"', "policy = 3"), "policy"),
    (lambda s: s + "x = " + "[" * 100_000 + "]" * 100_000 + "\n", "spec.toml"),
    (lambda s: s.replace('[inputs.a]\ntrace = "TRACE"', 'inputs = 5'), "inputs"),
    (lambda s: "\x00\xff", "spec.toml"),
    (lambda s: s.replace("[grid]", "grid = 3\n[x]"), "spec.toml"),
    (lambda s: s + 'offsets = "random:0:99999999999999999999"\n', "offsets"),
    (lambda s: s + 'offsets = "stagger:9223372036854775807"\n', "offsets"),
])
def test_hostile_specs_are_one_line_errors(tmp_path, base, edit, fragment):
    spec = tmp_path / "spec.toml"
    text = edit(GOOD_SPEC).replace("TRACE", str(base / "trace"))
    spec.write_bytes(text.encode("latin-1") if "\xff" in text else text.encode())
    refuse(tmp_path, ["spec", "expand", spec], fragment)


def test_a_huge_rotation_window_does_not_hang(tmp_path, base):
    """The deadline look-ahead is bounded by the admitted sessions, not by the window (2**63 - 1 here)."""
    spec = _spec(tmp_path, base, GOOD_SPEC.replace("batch = 2", 'batch = 2\ndiscipline = "rotation"\nadmitted = 4\n'
                                                   "window = 9223372036854775807"))
    res = bounded(lambda: CliRunner().invoke(main, ["spec", "run", str(spec), "--store", str(tmp_path / "st")]))
    assert res.exit_code == 0, res.output


def test_a_spec_with_a_byte_order_mark_is_accepted(tmp_path, base):
    p = _spec(tmp_path, base, GOOD_SPEC)
    p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes())
    assert CliRunner().invoke(main, ["spec", "expand", str(p)]).exit_code == 0


GOOD_CRITERIA = ('[prereg]\ntitle = "t"\n[splits.all]\nwhere = {}\n[[criteria]]\nid = "c"\nmetric = "gap"\n'
                 'comparison = ">="\nthreshold = 0.1\nsplit = "all"\n')


def test_good_criteria_freeze(tmp_path):
    (tmp_path / "c.toml").write_text(GOOD_CRITERIA)
    res = CliRunner().invoke(main, ["prereg", "freeze", str(tmp_path / "c.toml"), "-o", str(tmp_path / "d.json")])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("edit,fragment", [
    (lambda s: s.replace("threshold = 0.1", "threshold = nan"), "threshold"),
    (lambda s: s.replace("threshold = 0.1", "threshold = inf"), "threshold"),
    (lambda s: s.replace("threshold = 0.1", 'threshold = "x"'), "threshold"),
    (lambda s: s.replace('comparison = ">="', "comparison = 5"), "comparison"),
    (lambda s: s.replace('comparison = ">="', "comparison = [1]"), "comparison"),
    (lambda s: s.replace('split = "all"', "split = [1]"), "split"),
    (lambda s: s.replace("[splits.all]\nwhere = {}\n", "splits = [1]\n"), "splits"),
    (lambda s: s.replace('title = "t"', 'title = "t"\nrevisions = 5'), "revisions"),
    (lambda s: s + "x = " + "[" * 100_000 + "]" * 100_000 + "\n", "c.toml"),
    (lambda s: s.replace("threshold = 0.1", "threshold = " + HUGE_INT), "c.toml"),
    (lambda s: s.replace('metric = "gap"', "metric = {a = 1}"), "metric"),
])
def test_hostile_criteria_are_one_line_errors(tmp_path, edit, fragment):
    (tmp_path / "c.toml").write_text(edit(GOOD_CRITERIA))
    refuse(tmp_path, ["prereg", "freeze", tmp_path / "c.toml", "-o", tmp_path / "d.json"], "c.toml", fragment)


# ============================================================================= labels and prompts
def _read_labels(p):
    from expertcache.trace.labels import read_labels

    return read_labels(p)


@pytest.mark.parametrize("name,data,fragment", [
    ("l.csv", b"request_id,category\na," + b"x" * (200 << 10) + b"\n", "not readable CSV"),
    ("l.csv", b"request_id,category\n,b\n", "request_id"),
    ("l.csv", b"id,cat\na,b\n", "header"),
    ("l.csv", b"request_id,category\n\xff\xfe,b\n", "UTF-8"),
    ("l.csv", b"request_id,category\na,\n", "category"),
    ("l.csv", b"request_id,category\na,b\na,c\n", "labelled twice"),
    ("l.jsonl", DEEP.encode(), "nesting"),
    ("l.jsonl", b'{"request_id": "a", "category": "\\ud800"}\n', "surrogate"),
    ("l.jsonl", b'{"request_id": ' + HUGE_INT.encode() + b', "category": "a"}\n', "64-bit"),
    ("l.jsonl", b'{"request_id": "a", "category": 5}\n', "category"),
    ("l.jsonl", b"[1]\n", "JSON object"),
])
def test_hostile_labels_are_one_line_errors(tmp_path, name, data, fragment):
    (tmp_path / name).write_bytes(data)
    refuse_call(tmp_path, lambda: _read_labels(tmp_path / name), name, fragment)


def test_labels_csv_from_excel_with_a_byte_order_mark_is_accepted(tmp_path):
    (tmp_path / "l.csv").write_bytes(b"\xef\xbb\xbfrequest_id,category\na,math\n")
    assert _read_labels(tmp_path / "l.csv") == {"a": "math"}


@pytest.mark.parametrize("data,fragment", [
    (DEEP.encode(), "nesting"),
    (b'{"prompt": "\\ud800"}\n', "surrogate"),
    (b'{"prompt": "a", "id": ' + HUGE_INT.encode() + b"}\n", "64-bit"),
    (b'{"prompt": 5}\n', "field 'prompt'"),
    (b'{"messages": [{"role": 1}]}\n', "field 'messages'"),
    (b'{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "x"}\n', "duplicate"),
    (b'{"prompt": "a", "evil": 1}\n', "unknown field"),
    (b"\n\n", "no prompts"),
    (b"\xff\n", "UTF-8"),
    (b'{"prompt": "a"\n', "not valid JSON"),
    (b'{"prompt": "a", "messages": []}\n', "exactly one"),
])
def test_hostile_prompts_fail_before_any_model_loads(tmp_path, data, fragment):
    (tmp_path / "p.jsonl").write_bytes(data)
    refuse(tmp_path, ["collect", "no/such-model", "--prompts", tmp_path / "p.jsonl", "-o", tmp_path / "out"],
           "p.jsonl", fragment)


# ============================================================================= collected-trace manifests
@pytest.fixture
def collected(trace_dir) -> Path:
    """The trace with a hidden-state array, as ``collect --save-hidden`` lays it out."""
    m = json.loads((trace_dir / "manifest.json").read_text())
    arr = np.zeros((m["n_tokens"], m["n_layers"], 4), np.float16)
    np.save(trace_dir / "hidden.npy", arr)
    m["arrays"] = {"hidden": [{"file": "hidden.npy", "sha256": sha256_file(trace_dir / "hidden.npy"),
                               "rows": m["n_tokens"]}]}
    (trace_dir / "manifest.json").write_text(json.dumps(m))
    return trace_dir


def _read_array(d):
    from expertcache.collect import read_array

    return read_array(d, "hidden")


def test_a_valid_collected_array_reads(collected):
    assert _read_array(collected).shape[2] == 4


def _set_entry(d: Path, **kw) -> None:
    m = json.loads((d / "manifest.json").read_text())
    m["arrays"]["hidden"][0].update(kw)
    (d / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("case,fragment", [
    ("absolute", "leaves the directory"),
    ("dotdot", "leaves the directory"),
    ("symlink", "symbolic link leaving"),
    ("backslash", "relative file name"),
    ("not_string", "relative file name"),
    ("rows", "rows"),
    ("entries", "list of"),
    ("huge_header", "declares"),
    ("wrong_dtype", "dtype"),
    ("sha", "sha256 mismatch"),
    ("object", "object arrays"),
])
def test_collected_manifest_paths_stay_inside_and_arrays_are_checked(collected, tmp_path, case, fragment):
    outside = tmp_path / "x.npy"
    np.save(outside, np.zeros((3, 3), np.float16))
    sha = sha256_file(outside)
    if case == "absolute":
        _set_entry(collected, file=str(outside), sha256=sha)
    elif case == "dotdot":
        _set_entry(collected, file="../x.npy", sha256=sha)
    elif case == "symlink":
        (collected / "hidden.npy").unlink()
        (collected / "hidden.npy").symlink_to(outside)
    elif case == "backslash":
        _set_entry(collected, file="..\\x.npy")
    elif case == "not_string":
        _set_entry(collected, file=["hidden.npy"])
    elif case == "rows":
        _set_entry(collected, rows=10 ** 12)
    elif case == "entries":
        m = json.loads((collected / "manifest.json").read_text())
        m["arrays"]["hidden"] = "hidden.npy"
        (collected / "manifest.json").write_text(json.dumps(m))
    else:
        m = json.loads((collected / "manifest.json").read_text())
        n, L = m["n_tokens"], m["n_layers"]
        if case == "huge_header":
            data = _npy_bytes(np.zeros((n, L, 1), np.float16), shape=(n, L, 10 ** 9))
        elif case == "wrong_dtype":
            data = _npy_bytes(np.zeros((n, L, 4), np.float64))
        elif case == "object":
            data = _npy_bytes(np.zeros(0, np.int64)).replace(b"'<i8'", b"'|O' ")
        else:
            data = b"\x00" * 10
        (collected / "hidden.npy").write_bytes(data)
        if case != "sha":
            _set_entry(collected, sha256=sha256_file(collected / "hidden.npy"))
    refuse_call(tmp_path, lambda: _read_array(collected), fragment)


# ============================================================================= locks
def test_a_lock_records_its_holder_and_a_dead_holders_lock_is_taken_over(tmp_path):
    from expertcache.storage import exclusive_lock, lock_holder

    code = (f"import sys, time; sys.path.insert(0, {SRC!r})\n"
            "from expertcache.storage import exclusive_lock\n"
            f"with exclusive_lock({str(tmp_path)!r}, 'store'):\n    print('locked', flush=True); time.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        info = lock_holder(tmp_path)
        assert info["pid"] == holder.pid and info["host"] == socket.gethostname()
        with pytest.raises(ValidationError, match=f"pid {holder.pid} on {socket.gethostname()}"):
            with exclusive_lock(tmp_path, "store"):
                pass
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        t0 = time.perf_counter()
        with exclusive_lock(tmp_path, "store"):          # no manual cleanup
            assert lock_holder(tmp_path)["pid"] == os.getpid()
        assert time.perf_counter() - t0 < 5
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_two_collects_into_one_directory_are_serialised(tmp_path):
    from expertcache.collect.store import collection_lock

    code = (f"import sys, time; sys.path.insert(0, {SRC!r})\nfrom pathlib import Path\n"
            "from expertcache.collect.store import collection_lock\n"
            f"with collection_lock(Path({str(tmp_path)!r})):\n    print('locked', flush=True); time.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValidationError, match="another run holds this collection's lock"):
            with collection_lock(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()


# ============================================================================= the kill test
def _kill_spec(tmp_path: Path) -> Path:
    from expertcache.trace import select_requests
    from expertcache.trace.examples import example_trace

    select_requests(example_trace(), range(12)).save(tmp_path / "tr")
    spec = tmp_path / "spec.toml"
    spec.write_text(f'[inputs.a]\ntrace = "{tmp_path / "tr"}"\n[grid]\ninput = "a"\nbatch = [1, 2, 3, 4]\n'
                    'policy = ["lru", "lfu", "belady", "lfru"]\nrho = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]\n'
                    "tie_seed = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n")
    return spec


def _spec_run(spec: Path, store: Path, jobs: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC}
    # small result chunks: the first part lands early, long before an idle machine finishes the run
    return subprocess.Popen([sys.executable, "-c", "from expertcache.cli import main; main()", "spec", "run",
                             str(spec), "--store", str(store), "--jobs", str(jobs), "--chunk-seconds", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)


def _children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(p.name))
    return out


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find the workers")
def test_sigkill_of_a_parallel_spec_run_then_resume_gives_the_uninterrupted_bytes(tmp_path):
    spec = _kill_spec(tmp_path)
    ref = tmp_path / "ref"
    p = _spec_run(spec, ref, 1)
    assert p.wait(timeout=600) == 0, p.stderr.read().decode()
    store = tmp_path / "store"
    p = _spec_run(spec, store, 2)
    deadline = time.time() + 300
    while time.time() < deadline and not list((store / "parts").glob("part-*.parquet")):
        time.sleep(0.05)
    workers = _children(p.pid)
    assert workers, "the run has no worker processes"
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    t0 = time.time()
    while time.time() - t0 < 10 and any(Path(f"/proc/{w}").exists() and
                                        "Z" not in (Path(f"/proc/{w}/stat").read_text().rsplit(")", 1)[1][:3])
                                        for w in workers):
        time.sleep(0.1)
    alive = [w for w in workers if Path(f"/proc/{w}").exists()
             and "Z" not in Path(f"/proc/{w}/stat").read_text().rsplit(")", 1)[1][:3]]
    assert not alive, f"workers {alive} outlived the killed run"
    assert not (store / "results.parquet").exists(), "the run finished before the kill; make the spec larger"
    p = _spec_run(spec, store, 2)                    # immediately, no cleanup
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err.decode()
    assert (store / "results.parquet").read_bytes() == (ref / "results.parquet").read_bytes()


def test_workers_die_with_their_parent(tmp_path):
    """The worker initialiser: a process whose parent is SIGKILLed ends within a second or two."""
    code = (f"import sys, os, time; sys.path.insert(0, {SRC!r})\n"
            "from expertcache.experiment.executors import _die_with_parent\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    _die_with_parent(os.getppid())\n"
            "    time.sleep(600)\n"
            "    os._exit(0)\n"
            "print(pid, flush=True)\n"
            "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    time.sleep(0.5)
    parent.kill()
    parent.wait()
    t0 = time.time()
    while time.time() - t0 < 10:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        stat = Path(f"/proc/{child}/stat")
        if stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the worker outlived its parent")


def test_the_documented_bounds_are_the_code_s():
    """docs/safety.md §3 states each bound; the table must match the constants the code enforces."""
    import importlib
    import re

    from expertcache import jsonl, storage

    cli_main = importlib.import_module("expertcache.cli.main")
    from expertcache.nextuse import predictors

    text = (Path(__file__).resolve().parents[1] / "docs" / "safety.md").read_text()
    rows = dict(re.findall(r"^\| (.+?) \| (.+?) \| .+? \|$", text, flags=re.M))

    def num(cell: str) -> int:
        return int(cell.split()[0].replace(",", ""))

    assert num(rows["MoE layers `L`"]) == storage.MAX_LAYERS
    assert num(rows["experts per layer `N` (int16 ids)"]) == storage.MAX_EXPERTS
    assert num(rows["block universe `L x N`"]) == storage.MAX_BLOCKS
    assert num(rows["JSON / TOML nesting"]) == jsonl.MAX_DEPTH
    assert num(rows["JSON Lines record"]) << 20 == jsonl.MAX_LINE_BYTES
    assert num(rows["JSON / TOML document"]) << 20 == jsonl.MAX_DOCUMENT_BYTES
    assert num(rows["one `.npy` / all members of an `.npz`"]) << 30 == storage.MAX_ARRAY_BYTES
    assert int(rows["`.npz` compression ratio"].split("-")[0]) == storage.MAX_COMPRESSION_RATIO
    parquet = rows["Parquet decoded size"].split()
    assert (int(parquet[0].split("-")[0]), int(parquet[5])) == (storage.MAX_PARQUET_EXPANSION,
                                                               storage.MAX_PARQUET_FLOOR >> 20)
    depth, trees = rows["boosted trees: depth, count"].split(", ")
    assert (int(depth), int(trees.replace(",", ""))) == (predictors.MAX_TREE_DEPTH, predictors.MAX_TREES)
    assert num(rows["residency fractions per `--rho`"].rstrip(",")) == cli_main.MAX_RHO_VALUES
    from expertcache.events import fcfs

    assert num(rows["arrival offsets (`stagger:D`, `random:LO:HI`)"]) == fcfs.MAX_OFFSET


def test_usage_errors_are_one_line_and_a_bare_group_still_shows_its_help(tmp_path, stream_dir):
    refuse(tmp_path, ["replay", stream_dir, "--no-such-option"], "--no-such-option", "-h")
    refuse(tmp_path, ["replay"], "STREAM_DIR")
    res = CliRunner().invoke(main, ["trace"])
    assert "Usage:" in res.output and "import" in res.output
