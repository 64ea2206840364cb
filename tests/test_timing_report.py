"""`report --profile`: the time section equals `simulate` called directly; §6.6's budget follows the profile."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.events import build_events, read_events
from expertcache.replay import ReplayConfig
from expertcache.report import ReportConfig, build_report
from expertcache.timing import HardwareProfile, load_profile, save_profile, simulate
from expertcache.trace import select_requests
from expertcache.trace.examples import example_trace

FAST = dict(seeds=(0,), rhos=(0.4,), batches=(4,), n_permutations=0)


@pytest.fixture(scope="module")
def stream_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tr") / "s"
    build_events(select_requests(example_trace(), range(8)), 4).save(out)
    return out


def test_time_section_is_simulate_called_directly(stream_dir, tmp_path):
    res = CliRunner().invoke(main, ["report", str(stream_dir), "-o", str(tmp_path / "r"), "--no-figures",
                                    "--permutations", "0", "--seed", "0", "--sweep-rho", "0.4",
                                    "--block-bytes", "1000000", "--profile", "pcie-gen4-x16"])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    tm = data["timing"]
    assert tm["profile"]["name"] == "pcie-gen4-x16" and tm["profile"]["measured"] == "stated"
    assert tm["expert_bytes"] == 1_000_000 and tm["expert_bytes_source"] == "given"
    stream, prof = read_events(stream_dir), load_profile("pcie-gen4-x16")
    policies = [r["policy"] for r in tm["rows"]]
    assert policies[:2] == ["lru", "lfu"] and "belady" in policies and data["gap"]["best_causal"] in policies
    for row in tm["rows"]:
        want = simulate(stream, ReplayConfig(row["policy"], rho=0.4, seed=0), prof, expert_bytes=1_000_000)
        assert row == json.loads(json.dumps(want.to_dict()))
    md = (tmp_path / "r" / "report.md").read_text()
    lru = tm["rows"][0]
    assert "## Time per output token" in md and prof.source in md
    assert f"| lru | {lru['transferred']:,} | {lru['tpot_mean_s'] * 1e3:.4g} | {lru['tpot_p50_s'] * 1e3:.4g} | " in md
    # the canonical command names the profile, so the report can be regenerated
    assert "--profile pcie-gen4-x16" in data["command"]


def test_budget_cell_follows_the_profile(stream_dir, tmp_path):
    base = dict(FAST, block_bytes=1e6, target_tokens_per_s=100.0)
    need = build_report(stream_dir, ReportConfig(**base)).data["traffic"]["offline_bandwidth_needed"]
    cells = {}
    for name, bw in (("fast", 2 * need), ("slow", need / 2)):
        save_profile(HardwareProfile(name, "stated for the test", bandwidth=bw), tmp_path / f"{name}.json")
        rep = build_report(stream_dir, ReportConfig(**base, profile=str(tmp_path / f"{name}.json")))
        tr = rep.data["traffic"]
        assert tr["bandwidth_budget"] == bw and tr["bandwidth_budget_source"] == f"profile {name} (stated)"
        assert f"profile {name} (stated)" in rep.block
        cells[name] = tr["cell"]
    assert "offline within budget" in cells["fast"] and "offline over budget" in cells["slow"]
    # a hand-given bandwidth wins over the profile's, and the block says so
    rep = build_report(stream_dir, ReportConfig(**base, bandwidth_budget=need / 2, profile=str(tmp_path / "fast.json")))
    assert "offline over budget" in rep.data["traffic"]["cell"] and "given (--bandwidth)" in rep.block
    # without a profile there is no time section
    assert build_report(stream_dir, ReportConfig(**base)).data["timing"].startswith("not reported")


def test_bad_profile_fails_before_measuring(stream_dir, tmp_path):
    res = CliRunner().invoke(main, ["report", str(stream_dir), "-o", str(tmp_path / "r"), "--no-figures",
                                    "--profile", str(tmp_path / "nope.json")])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and not (tmp_path / "r").exists()
