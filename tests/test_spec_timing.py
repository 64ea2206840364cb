"""Timing metrics in a spec run: a [timing] table stores simulate's metrics beside every condition's counts."""

from __future__ import annotations

import json

import pytest

from expertcache.errors import ValidationError
from expertcache.events import build_events
from expertcache.experiment import expand, read_results, run_spec, spec_from_dict, summarize
from expertcache.experiment.timing import TIMING_METRICS
from expertcache.replay import ReplayConfig
from expertcache.timing import HardwareProfile, load_profile, save_profile, simulate
from expertcache.trace.synth import SynthConfig, synthesize_trace


def tiny():
    return synthesize_trace(SynthConfig(n_layers=2, n_experts=8, top_k=2, n_requests=6, decode_tokens=6,
                                        working_set=4, seed=1))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec")
    tiny().save(root / "t")
    return root


def spec(root, timing=None, semantics=("event-atomic", "sequential-ascending")):
    d = {"experiment": {"name": "timed"}, "inputs": {"a": {"trace": "t"}},
         "grid": {"input": "a", "batch": [1, 3], "policy": ["lru", "belady"], "rho": [0.25, 0.5],
                  "semantics": list(semantics), "tie_seed": 0}}
    if timing is not None:
        d["timing"] = timing
    return spec_from_dict(d, base_dir=root)


def test_spec_stores_the_timing_metrics_of_simulate(root, tmp_path):
    save_profile(HardwareProfile("mine", "stated for the test", bandwidth=2e9, latency_s=1e-5,
                                 expert_fixed_s=1e-5, dense_fixed_s=2e-5), root / "mine.json")
    s = spec(root, {"profile": "mine.json", "expert_bytes": 1 << 20})
    run_spec(s, tmp_path / "store")
    table = read_results(tmp_path / "store")
    rows = table.to_pylist()
    trace = tiny()
    prof = load_profile(root / "mine.json")
    n = 0
    for p in expand(s):
        c = p.condition
        got = {r["metric"]: r["value"] for r in rows if r["condition_id"] == p.condition_id}
        assert set(TIMING_METRICS) <= set(got)
        cfg = ReplayConfig(c.policy, rho=c.rho, semantics=c.semantics, seed=c.tie_seed)
        want = simulate(build_events(trace, c.batch), cfg, prof, expert_bytes=1 << 20,
                        contract="fused" if c.semantics == "event-atomic" else "serialized")
        assert got["transferred"] == want.transferred        # the replay's count, the timed one's too
        for m in TIMING_METRICS:
            assert got[m] == pytest.approx(getattr(want, m), rel=1e-12), (m, c)
        n += 1
    assert n == 16
    # the metrics pivot like any other
    cell = summarize(table, "tpot_mean_s", rows=("policy",), cols=("batch",), where={"rho": [0.25]}).to_dict()
    assert cell["metric"] == "tpot_mean_s"


def test_timing_changes_hashes_not_ids_and_a_subset_of_metrics(root, tmp_path):
    plain, timed = expand(spec(root)), expand(spec(root, {"profile": "pcie-gen4-x16", "expert_bytes": 1000}))
    assert [p.condition_id for p in plain] == [p.condition_id for p in timed]
    assert all(a.condition_hash != b.condition_hash for a, b in zip(plain, timed, strict=True))
    other = expand(spec(root, {"profile": "pcie-gen5-x16", "expert_bytes": 1000}))
    assert all(a.condition_hash != b.condition_hash for a, b in zip(timed, other, strict=True))
    s = spec(root, {"profile": "pcie-gen4-x16", "expert_bytes": 1000, "metrics": ["tpot_p99_s", "stall_share"]},
             semantics=("event-atomic",))
    run_spec(s, tmp_path / "st")
    metrics = set(read_results(tmp_path / "st")["metric"].to_pylist())
    assert {"tpot_p99_s", "stall_share", "miss_fraction"} <= metrics and "tpot_mean_s" not in metrics
    run_spec(spec(root), tmp_path / "plain")
    assert not set(TIMING_METRICS) & set(read_results(tmp_path / "plain")["metric"].to_pylist())


@pytest.mark.parametrize("timing,words", [
    ({}, "needs profile"), ({"profile": "nope"}, "no such profile"),
    ({"profile": "pcie-gen4-x16", "metrics": ["tpot"]}, "metrics must list"),
    ({"profile": "pcie-gen4-x16", "expert_bytes": 0}, "expert_bytes"),
    ({"profile": "pcie-gen4-x16"}, "block size is unknown"),
    ({"profile": "pcie-gen4-x16", "speed": 1}, "unknown key"),
])
def test_bad_timing_tables_are_one_line_errors(root, timing, words):
    with pytest.raises(ValidationError, match=words) as err:
        spec(root, timing)
    assert "\n" not in str(err.value)


def test_timing_refuses_sequential_random(root):
    with pytest.raises(ValidationError, match="event-atomic"):
        expand(spec(root, {"profile": "pcie-gen4-x16", "expert_bytes": 10}, semantics=("sequential-random",)))


def test_a_timed_spec_runs_from_toml(root, tmp_path):
    from click.testing import CliRunner

    from expertcache.cli import main

    (root / "timed.toml").write_text(
        '[experiment]\nname = "timed"\n[inputs.a]\ntrace = "t"\n[timing]\nprofile = "nvlink-c2c"\n'
        'expert_bytes = 4096\nmetrics = ["tpot_mean_s", "tokens_per_s"]\n'
        '[grid]\ninput = "a"\nbatch = 2\npolicy = ["lru", "lfu"]\nrho = 0.5\n')
    res = CliRunner().invoke(main, ["spec", "run", str(root / "timed.toml"), "--store", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["spec", "summary", str(tmp_path / "s"), "--metric", "tokens_per_s",
                                    "--rows", "policy", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["metric"] == "tokens_per_s"
