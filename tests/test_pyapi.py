"""Python API niceties: tables from results, streams and traces; the bundled examples; short reprs;
``trace info``'s provenance summary."""

from __future__ import annotations

import importlib.util
import json
from importlib import resources

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from expertcache import examples
from expertcache.cli import main
from expertcache.errors import ExpertCacheError, ValidationError
from expertcache.events import EventStream, build_events
from expertcache.replay import ReplayConfig, replay, results_to_arrow, results_to_pandas, sweep
from expertcache.trace import RoutingTrace


def small():
    # docs/semantics.md example: LRU, c=2, ties by id -> hits 2, misses 4, logical 6
    return EventStream.from_lists(1, 4, 2, steps=[0, 1, 2], layers=[0, 0, 0], experts=[[0, 1], [1, 2], [0, 1]],
                                  active=[1, 1, 1])


def test_replay_result_to_arrow_one_row_and_per_layer():
    s = EventStream.from_lists(2, 4, 2, steps=[0, 0, 1], layers=[0, 1, 0], experts=[[0, 1], [2], [0, 3]],
                               active=[1, 1, 1])
    r = replay(s, ReplayConfig("lru", capacity=(1, 1), tie_break="id"))
    t = r.to_arrow()
    assert t.num_rows == 1
    row = t.to_pylist()[0]
    # layer 0: {0,1} 2 misses (keeps 0), {0,3}: 0 hits -> 1 hit, 3 misses; layer 1: {2} 1 miss
    assert (row["hits"], row["demand_misses"], row["logical"], row["policy"]) == (1, 4, 6, "lru")
    assert row["miss_fraction"] == pytest.approx(4 / 6)
    layers = r.to_arrow(per_layer=True).to_pylist()
    assert [(x["layer"], x["hits"], x["demand_misses"], x["capacity"]) for x in layers] == [(0, 1, 3, 1), (1, 0, 1, 1)]
    assert all(x["policy"] == "lru" and x["semantics"] == "event-atomic" for x in layers)


def test_sweep_results_table_in_input_order():
    s = small()
    res = sweep(s, [ReplayConfig("lru", rho=r, tie_break="id") for r in (0.25, 0.5, 1.0)])
    t = results_to_arrow(res)
    assert t.column("rho").to_pylist() == [0.25, 0.5, 1.0]
    # rho 0.25, c=1: {0,1} 2 misses, keeps 0 (lower id); {1,2} 2 misses, keeps 1; {0,1}: 1 hits, 0 misses -> 5.
    # rho 0.5, c=2: 4 (the docstring example); rho 1.0, c=4: the 3 distinct blocks miss once each -> 3
    assert t.column("demand_misses").to_pylist() == [5, 4, 3]
    assert results_to_arrow(res, per_layer=True).num_rows == 3


def test_any_record_with_to_dict_to_arrow():
    from expertcache.analysis import replay_bytes
    from expertcache.frames import records_to_arrow

    s = small()
    rows = records_to_arrow([replay_bytes(s, 4, 10), replay_bytes(s, 2, 10, warmup_events=1)]).to_pylist()
    # 3 steps of 1 active request each: 3 tokens, and 2 after a warm-up of one event
    assert [(r["bytes_moved"], r["output_tokens"]) for r in rows] == [(40, 3), (20, 2)]
    r = replay(s, ReplayConfig("lru", capacity=(2,), tie_break="id"))
    nested = records_to_arrow([r]).to_pylist()[0]
    assert nested["hits"] == 2 and nested["per_layer"][0]["demand_misses"] == 4


def test_stream_and_trace_to_arrow(tmp_path):
    s = small()
    t = s.to_arrow()
    assert t.num_rows == s.n_events and t.column("experts").to_pylist() == [[0, 1], [1, 2], [0, 1]]
    s.save(tmp_path / "s")
    assert pq.read_table(tmp_path / "s" / "events.parquet").equals(t)   # the stored table, column for column
    tr = examples.load("example_model_trace")
    table = tr.to_arrow()
    assert table.num_rows == tr.n_tokens * tr.n_layers
    first = table.slice(0, tr.n_layers).to_pylist()
    assert [r["layer"] for r in first] == list(range(tr.n_layers))
    assert first[1]["experts"] == tr.experts[0, 1].tolist()


def test_to_pandas_without_pandas_is_one_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pandas" else real(name, *a))
    s = small()
    r = replay(s, ReplayConfig("lru", capacity=(2,)))
    for call in (r.to_pandas, s.to_pandas, lambda: results_to_pandas([r]),
                 examples.load("example_model_trace").to_pandas):
        with pytest.raises(ExpertCacheError, match=r"pip install pandas") as e:
            call()
        assert "\n" not in str(e.value)


def test_to_pandas_with_pandas():
    pytest.importorskip("pandas")
    s = small()
    df = replay(s, ReplayConfig("lru", capacity=(2,), tie_break="id")).to_pandas()
    assert df.loc[0, "hits"] == 2 and len(s.to_pandas()) == 3


def test_examples_cover_the_bundled_data_and_load():
    data = resources.files("expertcache") / "data"
    on_disk = {p.name for p in data.iterdir()}
    listed = {examples.describe(n).relpath.split("/")[0] for n in examples.names()}
    assert on_disk == listed, on_disk ^ listed          # every bundled file is reachable by name
    for name in examples.names():
        p = examples.path(name)
        assert p.exists(), name
        assert (p / "manifest.json").is_file() if examples.describe(name).kind == "trace" else p.is_file()
    tr = examples.load("example_model_trace")
    assert isinstance(tr, RoutingTrace) and (tr.n_layers, tr.n_experts, tr.top_k, tr.n_requests) == (4, 32, 4, 56)
    conf = examples.load("conformance_events")
    assert (conf.n_layers, conf.n_experts, conf.union) == (3, 4, 30)      # docs/conformance.md: 30 union accesses
    with pytest.raises(ValidationError, match="unknown example 'nope'; choose from example_model_trace") as e:
        examples.path("nope")
    assert "\n" not in str(e.value)
    with pytest.raises(ValidationError, match="is a prompts file"):
        examples.load("example_prompts")


def test_short_reprs():
    tr = examples.load("example_model_trace")
    s = build_events(tr, 4)
    r = replay(s, ReplayConfig("lru"))
    for obj, head in ((tr, "RoutingTrace(L=4, N=32, k=4, n_requests=56"), (s, "EventStream(L=4, N=32, k=4, n_events="),
                      (r, "ReplayResult(policy='lru', semantics='event-atomic'")):
        text = repr(obj)
        assert text.startswith(head) and len(text) < 300 and "array(" not in text, text
    assert f"n_events={s.n_events}," in repr(s) and f"hits={r.hits}," in repr(r)


def test_trace_info_summarises_provenance_and_full_prints_it():
    path = str(examples.path("example_model_trace"))
    tr = examples.load("example_model_trace")
    out = CliRunner().invoke(main, ["trace", "info", path])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if x.startswith("provenance"))
    assert len(line) < 600 and f"{len(tr.provenance)} keys: " in line and "expert_block_bytes=98304" in line
    assert "--full or --json for all" in line
    full = CliRunner().invoke(main, ["trace", "info", path, "--full"]).output
    body = full.split("provenance", 1)[1].strip()
    assert json.loads(body) == json.loads(json.dumps(tr.provenance, default=str))
    info = json.loads(CliRunner().invoke(main, ["trace", "info", path, "--json"]).output)
    assert info["provenance"] == json.loads(json.dumps(tr.provenance))
