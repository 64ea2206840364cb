"""Bad input gets a one-line error naming file, record and field, exit status 2, and no output left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import route_records, write_jsonl

from expertcache.cli import main


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def assert_clean_failure(res, out: Path, *fragments: str) -> None:
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.strip().splitlines() if x]
    assert len(lines) == 1, res.output  # one line, no traceback
    assert lines[0].startswith("error: ")
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])
    assert "Traceback" not in res.output
    assert not out.exists()
    assert not [
        p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")
    ]  # no temp leftovers


def _import(tmp_path: Path, records: list, **kw) -> tuple:
    src = write_jsonl(tmp_path / "routes.jsonl", records)
    out = tmp_path / "trace"
    res = invoke(
        "trace",
        "import",
        str(src),
        "--layers",
        str(kw.get("L", 2)),
        "--experts",
        str(kw.get("N", 6)),
        "--top-k",
        str(kw.get("k", 2)),
        "-o",
        str(out),
    )
    return res, out


def test_expert_id_out_of_range(tmp_path):
    recs = route_records()
    recs[4]["experts"] = [1, 6]
    res, out = _import(tmp_path, recs)
    assert_clean_failure(res, out, "routes.jsonl", "record 5", "field 'experts'", "[0, 6)", "got 6")


def test_wrong_k(tmp_path):
    recs = route_records()
    recs[2]["experts"] = [1, 2, 3]
    res, out = _import(tmp_path, recs)
    assert_clean_failure(res, out, "routes.jsonl", "record 3", "field 'experts'", "expected 2")


def test_non_monotone_positions(tmp_path):
    recs = route_records(n_requests=1)
    recs[5]["position"] = 3  # line 6 (token 2, layer 1) follows position 12 on line 5
    res, out = _import(tmp_path, recs)
    assert_clean_failure(res, out, "record 6", "field 'position'", "3 after 12", "line 5")


def test_nan_gates(tmp_path):
    recs = [json.dumps(r) for r in route_records()]
    recs[7] = recs[7].replace('"gates": [0.5, 0.5]', '"gates": [NaN, 0.5]')
    res, out = _import(tmp_path, recs)
    assert_clean_failure(res, out, "record 8", "field 'gates'", "finite")


def test_duplicate_route_record(tmp_path):
    recs = route_records()
    recs.insert(2, dict(recs[1]))
    res, out = _import(tmp_path, recs)
    assert_clean_failure(res, out, "record 3", "duplicate")


def test_missing_layer(tmp_path):
    recs = route_records()
    del recs[3]
    res, out = _import(tmp_path, recs)
    assert_clean_failure(res, out, "routes.jsonl", "layer 1 has no record")


def test_truncated_jsonl(tmp_path):
    src = write_jsonl(tmp_path / "routes.jsonl", route_records())
    text = src.read_text()
    src.write_text(text[: len(text) - 25])
    out = tmp_path / "trace"
    res = invoke("trace", "import", str(src), "-L", "2", "-N", "6", "-k", "2", "-o", str(out))
    assert_clean_failure(res, out, "routes.jsonl", "record 24", "truncated")


def _events(tmp_path: Path, records: list, L=2, N=4, k=1):
    src = write_jsonl(tmp_path / "events.jsonl", records)
    out = tmp_path / "stream"
    res = invoke(
        "events", "import", str(src), "-L", str(L), "-N", str(N), "-k", str(k), "-o", str(out)
    )
    return res, out


GOOD_EVENTS = [
    {"step": 0, "layer": 0, "experts": [0, 1], "active": 2},
    {"step": 0, "layer": 1, "experts": [2], "active": 2},
    {"step": 1, "layer": 0, "experts": [3], "active": 1},
]


def test_duplicate_step_layer(tmp_path):
    res, out = _events(
        tmp_path, GOOD_EVENTS + [{"step": 0, "layer": 1, "experts": [1], "active": 1}]
    )
    assert_clean_failure(
        res, out, "events.jsonl", "record 4", "duplicate (step, layer) = (0, 1)", "line 2"
    )


def test_negative_step(tmp_path):
    res, out = _events(
        tmp_path, GOOD_EVENTS + [{"step": -1, "layer": 0, "experts": [1], "active": 1}]
    )
    assert_clean_failure(res, out, "events.jsonl", "record 4", "field 'step'", ">= 0")


def test_event_expert_out_of_range(tmp_path):
    res, out = _events(tmp_path, [{"step": 0, "layer": 0, "experts": [0, 4], "active": 2}])
    assert_clean_failure(res, out, "record 1", "field 'experts'", "got 4")


def test_event_multiplicity_must_sum_to_active_k(tmp_path):
    res, out = _events(
        tmp_path, [{"step": 0, "layer": 0, "experts": [0, 1], "active": 2, "multiplicity": [1, 2]}]
    )
    assert_clean_failure(res, out, "record 1", "field 'multiplicity'", "sum to active*k = 2")


def test_nan_gate_mass(tmp_path):
    rec = '{"step": 0, "layer": 0, "experts": [0], "active": 1, "gate_mass": [NaN]}'
    res, out = _events(tmp_path, [rec])
    assert_clean_failure(res, out, "record 1", "field 'gate_mass'", "finite")


@pytest.fixture
def stream_dir(tmp_path):
    src = write_jsonl(tmp_path / "events.jsonl", GOOD_EVENTS)
    out = tmp_path / "stream"
    assert (
        invoke(
            "events", "import", str(src), "-L", "2", "-N", "4", "-k", "1", "-o", str(out)
        ).exit_code
        == 0
    )
    return out


@pytest.fixture
def trace_dir(tmp_path, routes_file):
    out = tmp_path / "trace"
    res = invoke(
        "trace", "import", str(routes_file), "-L", "2", "-N", "6", "-k", "2", "-o", str(out)
    )
    assert res.exit_code == 0, res.output
    return out


def test_hash_mismatch_is_detected(tmp_path, trace_dir):
    data = trace_dir / "routes.parquet"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    out = tmp_path / "stream"
    res = invoke("events", "build", str(trace_dir), "--batch", "2", "-o", str(out))
    assert_clean_failure(res, out, "routes.parquet", "sha256 mismatch")


def test_truncated_parquet_is_detected(tmp_path, trace_dir):
    data = trace_dir / "routes.parquet"
    data.write_bytes(data.read_bytes()[:100])
    out = tmp_path / "stream"
    res = invoke("events", "build", str(trace_dir), "--batch", "2", "-o", str(out))
    assert_clean_failure(res, out, "routes.parquet", "sha256 mismatch")


def test_missing_manifest(tmp_path, trace_dir):
    (trace_dir / "manifest.json").unlink()
    out = tmp_path / "stream"
    res = invoke("events", "build", str(trace_dir), "--batch", "2", "-o", str(out))
    assert_clean_failure(res, out, "manifest.json is missing")


def test_truncated_manifest(tmp_path, stream_dir):
    m = stream_dir / "manifest.json"
    m.write_text(m.read_text()[:40])
    res = invoke("replay", str(stream_dir))
    assert res.exit_code == 2 and "manifest.json" in res.output and "truncated" in res.output


@pytest.mark.parametrize("rho", ["1.5", "-0.1", "nan"])
def test_rho_out_of_range(stream_dir, rho):
    res = invoke("replay", str(stream_dir), "--rho", rho)
    assert res.exit_code == 2
    assert "rho must be a number in [0, 1]" in res.output
    assert "Traceback" not in res.output


def test_unknown_policy(stream_dir):
    res = invoke("replay", str(stream_dir), "--policy", "lru,arc")
    assert res.exit_code == 2 and "unknown policy 'arc'" in res.output


def test_static_needs_calibration(stream_dir):
    res = invoke("replay", str(stream_dir), "--policy", "static")
    assert res.exit_code == 2 and "--calibration" in res.output


def test_bad_batch_and_offsets(tmp_path, trace_dir):
    out = tmp_path / "stream"
    res = invoke("events", "build", str(trace_dir), "--batch", "0", "-o", str(out))
    assert_clean_failure(res, out, "--batch must be a positive integer")
    res = invoke(
        "events", "build", str(trace_dir), "--batch", "2", "--offsets", "stagger:x", "-o", str(out)
    )
    assert_clean_failure(res, out, "stagger:D")


def test_existing_output_is_not_clobbered(tmp_path, trace_dir, routes_file):
    before = (trace_dir / "manifest.json").read_text()
    res = invoke(
        "trace", "import", str(routes_file), "-L", "2", "-N", "6", "-k", "2", "-o", str(trace_dir)
    )
    assert res.exit_code == 2 and "--overwrite" in res.output
    assert (trace_dir / "manifest.json").read_text() == before


def test_failed_overwrite_keeps_the_old_output(tmp_path, trace_dir):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"request_id": "a"}])
    before = (trace_dir / "manifest.json").read_text()
    res = invoke(
        "trace",
        "import",
        str(bad),
        "-L",
        "2",
        "-N",
        "6",
        "-k",
        "2",
        "-o",
        str(trace_dir),
        "--overwrite",
    )
    assert res.exit_code == 2
    assert (trace_dir / "manifest.json").read_text() == before
