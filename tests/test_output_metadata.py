"""Self-describing outputs (docs/design.md §3): every Parquet file carries ``expertcache.*`` key-value
metadata, every JSON file ``schema_version`` and ``tool_version``; files written before that still read."""

from __future__ import annotations

import hashlib
import json
from importlib import resources

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from expertcache import __version__
from expertcache.cli import main
from expertcache.events import build_events, read_events
from expertcache.experiment import read_results, run_spec, spec_from_dict
from expertcache.storage import read_parquet_metadata
from expertcache.trace import read_trace
from expertcache.trace.synth import SynthConfig, synthesize_trace

DATA = resources.files("expertcache") / "data"


def _meta(path) -> dict[str, str]:
    """The file's key-value metadata read with pyarrow alone (not the package's reader)."""
    raw = pq.ParquetFile(path).schema_arrow.metadata or {}
    return {k.decode(): v.decode() for k, v in raw.items() if k.startswith(b"expertcache.")}


def _common(meta: dict[str, str], row_word: str) -> None:
    assert meta["expertcache.tool_version"] == __version__
    assert meta["expertcache.schema_version"] == "1"
    assert row_word in meta["expertcache.row"]


def _trace():
    return synthesize_trace(SynthConfig(n_layers=3, n_experts=8, top_k=2, n_requests=6, decode_tokens=4,
                                        working_set=4, seed=5))


def test_trace_and_stream_parquet_carry_the_model_shape(tmp_path):
    tr = _trace()
    tr.save(tmp_path / "t")
    meta = _meta(tmp_path / "t" / "routes.parquet")
    _common(meta, "(token, layer)")
    assert (meta["expertcache.n_layers"], meta["expertcache.n_experts"], meta["expertcache.top_k"]) == ("3", "8", "2")
    s = build_events(tr, 2)
    s.save(tmp_path / "s")
    meta = _meta(tmp_path / "s" / "events.parquet")
    _common(meta, "event (step, layer)")
    assert (meta["expertcache.n_layers"], meta["expertcache.n_experts"], meta["expertcache.top_k"]) == ("3", "8", "2")
    assert read_parquet_metadata(tmp_path / "s" / "events.parquet")["n_layers"] == "3"
    # the written objects read back as before: same arrays
    assert np.array_equal(read_trace(tmp_path / "t").experts, tr.experts)
    assert read_events(tmp_path / "s").union == s.union


def test_experiment_store_parts_and_results_carry_metadata(tmp_path):
    _trace().save(tmp_path / "a")
    spec = spec_from_dict({"experiment": {"name": "meta"}, "inputs": {"a": {"trace": "a"}},
                           "grid": {"input": "a", "batch": 2, "policy": ["lru", "belady"], "rho": 0.5}}, tmp_path)
    from expertcache.experiment.store import ResultStore

    st = ResultStore.open(tmp_path / "parts-only", create=True)
    part = st.write_part([{"condition_id": "c", "condition_hash": "h", "metric": "gap", "value": 0.5}])
    _common(_meta(part), "(condition, metric)")
    run_spec(spec, tmp_path / "store", jobs=1)
    meta = _meta(tmp_path / "store" / "results.parquet")
    _common(meta, "(condition, metric)")
    assert meta["expertcache.spec_name"] == "meta" and meta["expertcache.n_conditions"] == "2"
    body = json.loads((tmp_path / "store" / "store.json").read_text())
    assert body["schema_version"] == 1 and body["tool_version"] == __version__ and body["complete"] is True


def test_timings_parquet_carries_metadata(tmp_path):
    from expertcache.execute.timings import TIMING_COLUMNS, write_timings

    cols = {"kind": np.array(["load", "forward"], dtype=object),
            **{k: np.array([1, 2], dtype=np.int64) for k in TIMING_COLUMNS[1:]}}
    write_timings(tmp_path / "t.parquet", cols)
    _common(_meta(tmp_path / "t.parquet"), "timed span")
    assert pq.read_table(tmp_path / "t.parquet")["kind"].to_pylist() == ["load", "forward"]


def test_files_written_without_metadata_still_read(tmp_path):
    # the bundled synthetic example was written before the metadata existed
    with resources.as_file(DATA / "example_trace") as src:
        assert read_parquet_metadata(src / "routes.parquet") == {}
        assert read_trace(src).n_tokens > 0
    # a result table written by plain pyarrow (an older store, or a user's own file)
    _trace().save(tmp_path / "a")
    run_spec(spec_from_dict({"inputs": {"a": {"trace": "a"}}, "grid": {"input": "a", "batch": 2, "policy": "lru",
                                                                       "rho": 0.5}}, tmp_path), tmp_path / "st")
    t = pq.read_table(tmp_path / "st" / "results.parquet")
    plain = t.replace_schema_metadata(None)
    pq.write_table(plain, tmp_path / "old.parquet")
    assert read_parquet_metadata(tmp_path / "old.parquet") == {}
    assert read_results(tmp_path / "old.parquet").equals(read_results(tmp_path / "st"))


def test_replay_lines_name_the_stream_and_its_manifest_hash(tmp_path):
    build_events(_trace(), 2).save(tmp_path / "s")
    res = CliRunner().invoke(main, ["replay", str(tmp_path / "s"), "--policy", "lru,belady", "--json"])
    assert res.exit_code == 0, res.output
    want = hashlib.sha256((tmp_path / "s" / "manifest.json").read_bytes()).hexdigest()
    lines = [json.loads(x) for x in res.output.splitlines()]
    assert len(lines) == 2
    for rec in lines:
        assert rec["stream"] == str(tmp_path / "s") and rec["stream_manifest_sha256"] == want


def test_json_files_carry_versions(tmp_path):
    from expertcache.timing import load_profile
    from expertcache.timing.profile import save_profile

    prof = load_profile("pcie-gen4-x16")
    save_profile(prof, tmp_path / "p.json")
    body = json.loads((tmp_path / "p.json").read_text())
    assert body["schema_version"] == 1 and body["tool_version"] == __version__
    assert load_profile(str(tmp_path / "p.json")) == prof          # the loader accepts what the saver adds
    build_events(_trace(), 2).save(tmp_path / "s")
    res = CliRunner().invoke(main, ["nextuse", "fit", str(tmp_path / "s"), "-o", str(tmp_path / "m.json")])
    assert res.exit_code == 0, res.output
    body = json.loads((tmp_path / "m.json").read_text())
    assert body["schema_version"] == 1 and body["tool_version"] == __version__
    res = CliRunner().invoke(main, ["nextuse", "eval", str(tmp_path / "m.json"), str(tmp_path / "s"), "--json"])
    assert res.exit_code == 0, res.output        # the model with its version fields loads


def test_with_metadata_keeps_other_keys():
    from expertcache.storage import with_metadata

    t = pa.table({"x": [1]}).replace_schema_metadata({"pandas": "{}"})
    out = with_metadata(t, "one x", shape=(1, 2, 3), note={"a": 1}, absent=None)
    meta = out.schema.metadata
    assert meta[b"pandas"] == b"{}" and meta[b"expertcache.row"] == b"one x"
    assert meta[b"expertcache.note"] == b'{"a": 1}' and b"expertcache.absent" not in meta


def test_collected_shards_and_the_merged_trace_carry_metadata(tmp_path):
    from expertcache.collect.store import finalize, shard_dir, write_shard

    tr = _trace()
    write_shard(tmp_path, 0, tr, {})
    _common(_meta(shard_dir(tmp_path, 0) / "routes.parquet"), "(token, layer)")
    merged = finalize(tmp_path, 1, {"model": "synthetic"})
    meta = _meta(tmp_path / "routes.parquet")
    _common(meta, "(token, layer)")
    assert meta["expertcache.top_k"] == "2"
    assert np.array_equal(read_trace(tmp_path).experts, merged.experts)
