"""The CLI end to end: import -> build -> replay, JSON contract and determinism."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.events import build_events, read_events
from expertcache.replay import policy_names
from expertcache.trace import read_trace, select_requests
from expertcache.trace.examples import example_trace

REQUIRED_KEYS = {
    "policy",
    "semantics",
    "scope",
    "rho",
    "capacity_total",
    "transferred",
    "initial_load",
    "hits",
    "demand_misses",
    "logical",
    "union",
    "miss_fraction",
}


def invoke(*args: str):
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return res.output


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli")
    tr = example_trace()
    idx = np.arange(tr.n_requests)
    select_requests(tr, idx[1:16:2]).save(base / "trace")
    build_events(select_requests(tr, idx[0:16:2]), 4).save(base / "calib")
    invoke(
        "events",
        "build",
        base / "trace",
        "--batch",
        4,
        "--offsets",
        "random:0:6",
        "--seed",
        3,
        "-o",
        base / "stream",
    )
    return base


def test_pipeline_roundtrip(dirs, routes_file, tmp_path):
    invoke(
        "trace",
        "import",
        routes_file,
        "-L",
        2,
        "-N",
        6,
        "-k",
        2,
        "-o",
        tmp_path / "t",
        "--model",
        "toy",
    )
    tr = read_trace(tmp_path / "t")
    assert (tr.n_requests, tr.n_tokens, tr.top_k) == (3, 12, 2)
    assert tr.provenance["model"] == "toy"
    invoke("events", "build", tmp_path / "t", "-B", 2, "-o", tmp_path / "s")
    s = read_events(tmp_path / "s")
    assert s.logical == 12 * 2 * 2
    info = json.loads(invoke("events", "info", tmp_path / "s", "--json"))
    assert info["union"] == s.union and info["provenance"]["batch"] == 2


def test_parquet_is_plain_and_readable_without_expertcache(dirs):
    routes = pq.read_table(dirs / "trace" / "routes.parquet")
    assert {"request_id", "phase", "position", "layer", "experts", "gates", "token_id"} <= set(
        routes.column_names
    )
    events = pq.read_table(dirs / "stream" / "events.parquet")
    assert {"step", "layer", "active", "logical", "experts", "multiplicity", "gate_mass"} <= set(
        events.column_names
    )
    manifest = json.loads((dirs / "stream" / "manifest.json").read_text())
    assert manifest["schema_version"] == 1 and manifest["n_experts"] == 64
    assert len(manifest["files"]["events.parquet"]["sha256"]) == 64
    assert (
        manifest["provenance"]["offsets"] == "random:0:6"
        and manifest["provenance"]["offsets_seed"] == 3
    )


def test_replay_json_one_object_per_run(dirs):
    out = invoke(
        "replay",
        dirs / "stream",
        "--policy",
        ",".join(policy_names(advice=False)),
        "--semantics",
        "event-atomic,sequential-ascending",
        "--calibration",
        dirs / "calib",
        "--json",
    )
    rows = [json.loads(line) for line in out.strip().splitlines()]
    assert len(rows) == len(policy_names(advice=False)) * 2
    for row in rows:
        assert REQUIRED_KEYS <= set(row)
        assert row["transferred"] == row["demand_misses"] + row["initial_load"]
        assert row["hits"] + row["demand_misses"] == row["union"]
        assert row["miss_fraction"] == pytest.approx(row["transferred"] / row["logical"])
    assert {(r["policy"], r["semantics"]) for r in rows} == {
        (p, s) for p in policy_names(advice=False) for s in ("event-atomic", "sequential-ascending")
    }


def test_replay_is_deterministic(dirs):
    args = ("replay", dirs / "stream", "--policy", "lru,lfru,belady,static-same-trace", "--rho", "0.2,0.4",
            "--semantics", "event-atomic,sequential-random", "--json")
    first = invoke(*args, "--seed", 7)
    assert first == invoke(*args, "--seed", 7)
    # the seed is really used: another seed reorders ties and the random flattening
    assert first != invoke(*args, "--seed", 8)


def test_replay_table_and_global_scope(dirs):
    out = invoke(
        "replay", dirs / "stream", "--policy", "lru,belady", "--scope", "global", "--per-layer"
    )
    assert "lru" in out and "belady" in out and "union/logical" in out


def test_demo_json_runs():
    out = json.loads(invoke("demo", "--json"))
    assert out["example"] == "model" and "Qwen3-MoE" in out["data"]
    assert {r["policy"] for r in out["rows"]} == set(policy_names(advice=False))
    syn = json.loads(invoke("demo", "--json", "--example", "synthetic"))
    assert syn["example"] == "synthetic" and "SYNTHETIC" in syn["data"]
