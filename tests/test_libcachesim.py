"""The libCacheSim bridge: our accesses in libCacheSim's formats, and its LRU / Belady counting exactly what ours do.

libCacheSim replays request by request, so its LRU must equal our ``sequential-ascending`` ``lru`` and its Belady
(every miss admitted) our ``sequential-ascending`` ``belady-forced``, layer by layer for per-layer scope.
"""

from __future__ import annotations

import json

import libcachesim as lcs
import numpy as np
import pytest
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.events import EventStream, build_events
from expertcache.events.prefill import prefill_initialised_events
from expertcache.replay import ReplayConfig, capacities_for_rho, replay
from expertcache.replay.libcachesim import (
    NEVER_AGAIN,
    ORACLE_GENERAL,
    export_stream,
    next_access_vtime,
)
from expertcache.trace.examples import example_model_trace
from expertcache.trace.synth import SynthConfig, synthesize_trace

PAIRS = (("LRU", "lru"), ("Belady", "belady-forced"))


def _theirs(path, capacity: int, n_requests: int, policy: str, csv: bool = False) -> int:
    if csv:
        params = lcs.ReaderInitParam(has_header=True, has_header_set=True, delimiter=",")
        params.time_field, params.obj_id_field, params.obj_size_field = 1, 2, 3
        reader = lcs.TraceReader(str(path), lcs.TraceType.CSV_TRACE, params)
    else:
        reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    cache = {"LRU": lcs.LRU, "Belady": lcs.Belady}[policy](capacity)
    miss_ratio, _ = cache.process_trace(reader)
    del cache, reader  # never reader.close(): the binding's deleter closes it again
    return int(round(miss_ratio * n_requests))


def _streams() -> dict[str, EventStream]:
    syn = synthesize_trace(SynthConfig(n_layers=3, n_experts=16, top_k=2, n_requests=8, decode_tokens=30,
                                       prefill_tokens=4, seed=1))
    return {"example-model B=8": build_events(example_model_trace(), 8), "synthetic B=4": build_events(syn, 4)}


def test_the_oracle_general_file_holds_the_hand_derived_records(tmp_path):
    """One layer, events {0,1}, {1,2}, {0,1}: requests 0,1 | 1,2 | 0,1 in ascending order within each event."""
    s = EventStream.from_lists(n_layers=1, n_experts=4, top_k=2, steps=[0, 1, 2], layers=[0, 0, 0],
                               experts=[[0, 1], [1, 2], [0, 1]], active=[1, 1, 1])
    ex = export_stream(s, tmp_path / "x", rho=0.5)
    rec = np.fromfile(tmp_path / "x" / ex.traces[0].file, dtype=ORACLE_GENERAL)
    assert rec["obj_id"].tolist() == [0, 1, 1, 2, 0, 1]
    assert rec["clock_time"].tolist() == [0, 0, 1, 1, 2, 2]
    assert rec["obj_size"].tolist() == [1] * 6
    assert rec["next_access_vtime"].tolist() == [4, 2, 5, NEVER_AGAIN, NEVER_AGAIN, NEVER_AGAIN]
    assert ex.traces[0].capacity == 2 and ex.traces[0].n_requests == 6 and ex.traces[0].n_objects == 3
    # LRU with 2 slots by hand: 0 m, 1 m, 1 h, 2 m (evicts 0), 0 m (evicts 1), 1 m (evicts 2): 5 misses
    assert _theirs(tmp_path / "x" / ex.traces[0].file, 2, 6, "LRU") == 5
    assert replay(s, ReplayConfig("lru", capacity=(2,), semantics="sequential-ascending")).demand_misses == 5


def test_next_access_against_a_naive_scan():
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 7, size=300)
    naive = [next((j for j in range(i + 1, len(ids)) if ids[j] == ids[i]), NEVER_AGAIN) for i in range(len(ids))]
    assert next_access_vtime(ids).tolist() == naive


@pytest.mark.parametrize("rho", [0.1, 0.4, 0.75])
def test_libcachesim_lru_and_belady_count_what_sequential_replay_counts_per_layer(tmp_path, rho):
    for name, stream in _streams().items():
        ex = export_stream(stream, tmp_path / f"{name}-{rho}", rho=rho)
        assert [t.capacity for t in ex.traces] == capacities_for_rho(rho, stream.n_layers, stream.n_experts).tolist()
        for theirs_name, ours_name in PAIRS:
            ours = replay(stream, ReplayConfig(ours_name, rho=rho, semantics="sequential-ascending"))
            theirs = [_theirs(tmp_path / f"{name}-{rho}" / t.file, t.capacity, t.n_requests, theirs_name)
                      for t in ex.traces]
            assert theirs == [lc.demand_misses for lc in ours.per_layer], (name, theirs_name)


def test_libcachesim_counts_global_scope_and_csv_alike(tmp_path):
    stream = _streams()["example-model B=8"]
    for fmt in ("oraclegeneral", "csv"):
        ex = export_stream(stream, tmp_path / fmt, fmt=fmt, scope="global", rho=0.4)
        (t,) = ex.traces
        assert t.n_requests == stream.expert.shape[0]
        policies = PAIRS if fmt == "oraclegeneral" else PAIRS[:1]  # CSV carries no next-access times
        for theirs_name, ours_name in policies:
            ours = replay(stream, ReplayConfig(ours_name, rho=0.4, scope="global", semantics="sequential-ascending"))
            assert _theirs(tmp_path / fmt / t.file, t.capacity, t.n_requests, theirs_name,
                           csv=fmt == "csv") == ours.demand_misses, (fmt, theirs_name)


def test_warmup_events_are_counted_and_said(tmp_path):
    stream = prefill_initialised_events(example_model_trace(), 4, chunk=16)
    warm = stream.provenance["warmup_events"]
    ex = export_stream(stream, tmp_path / "x", rho=0.4)
    assert ex.warmup_events == warm > 0
    size = np.diff(stream.offsets)
    for t in ex.traces:
        assert t.warmup_requests == int(size[:warm][stream.layer[:warm] == t.layer].sum())
    assert any("warm-up" in n for n in ex.notes)
    # with the warm-up counted, libCacheSim's LRU equals our replay with --warmup-events 0
    ours = replay(stream, ReplayConfig("lru", rho=0.4, semantics="sequential-ascending", warmup_events=0))
    assert [_theirs(tmp_path / "x" / t.file, t.capacity, t.n_requests, "LRU") for t in ex.traces] == \
        [lc.demand_misses for lc in ours.per_layer]


def test_cli_export_writes_the_capacities_and_refuses_bad_input(tmp_path):
    runner = CliRunner()
    stream = _streams()["synthetic B=4"]
    stream.save(tmp_path / "s")
    res = runner.invoke(main, ["events", "export", str(tmp_path / "s"), "-o", str(tmp_path / "x"), "--rho", "0.25",
                               "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    written = json.loads((tmp_path / "x" / "export.json").read_text())
    assert [t["capacity"] for t in out["traces"]] == [t["capacity"] for t in written["traces"]] == \
        capacities_for_rho(0.25, 3, 16).tolist()
    assert written["stream"]["manifest_sha256"] and written["order"] == "sequential-ascending"
    again = runner.invoke(main, ["events", "export", str(tmp_path / "s"), "-o", str(tmp_path / "x")])
    assert again.exit_code == 2 and "already exists" in again.output
    bad = runner.invoke(main, ["events", "export", str(tmp_path / "nothing"), "-o", str(tmp_path / "y")])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1 and "Traceback" not in bad.output
    assert not (tmp_path / "y").exists()
    rho = runner.invoke(main, ["events", "export", str(tmp_path / "s"), "-o", str(tmp_path / "z"), "--rho", "2"])
    assert rho.exit_code == 2 and "rho" in rho.output and not (tmp_path / "z").exists()


def test_the_docs_snippet_runs_on_an_export_of_the_bundled_example(tmp_path, monkeypatch, capsys):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "libcachesim.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    stream = _streams()["example-model B=8"]
    export_stream(stream, tmp_path / "lcs", rho=0.4)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block, "docs/libcachesim.md", "exec"), scope)
    lru = replay(stream, ReplayConfig("lru", rho=0.4, semantics="sequential-ascending")).demand_misses
    forced = replay(stream, ReplayConfig("belady-forced", rho=0.4, semantics="sequential-ascending")).demand_misses
    assert scope["misses"]["LRU"] == lru and scope["misses"]["Belady"] == forced
    assert set(scope["misses"]) == {"LRU", "Belady", "S3FIFO", "ARC"} and "LRU" in capsys.readouterr().out
