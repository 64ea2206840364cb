"""The timing model: a hand-derived timeline matched exactly, counts equal to the replay, profiles, the command."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.errors import ValidationError
from expertcache.events import EventStream, build_events
from expertcache.replay import ReplayConfig, policy_names, replay
from expertcache.timing import HardwareProfile, load_profile, save_profile, simulate
from expertcache.timing.model import nearest_rank
from expertcache.trace.synth import SynthConfig, synthesize_trace

# Two layers, three steps, one request choosing two experts per layer; capacity 2 per layer, LRU.
#   layer 0: {0,1} {0,2} {0,1}  ->  M M | H M | H M      layer 1: {0,1} {1,2} {2,3}  ->  M M | H M | H M
TINY = EventStream.from_lists(n_layers=2, n_experts=4, top_k=2, steps=[0, 0, 1, 1, 2, 2], layers=[0, 1] * 3,
                              experts=[[0, 1], [0, 1], [0, 2], [1, 2], [0, 1], [2, 3]], active=[1] * 6)
#: step 10 + 1/token; dense 1 + 0.5/token; expert 2 + 1/routed token (= 3 here); a transfer 0.5 + 4 B / 1 B/s
HAND = HardwareProfile("hand", "hand-made for the test", bandwidth=1.0, latency_s=0.5, expert_bytes=4,
                       dense_fixed_s=1.0, dense_per_token_s=0.5, expert_fixed_s=2.0, expert_per_token_s=1.0,
                       step_fixed_s=10.0, step_per_token_s=1.0)
LRU2 = ReplayConfig("lru", capacity=(2, 2), tie_break="id")


def test_hand_derived_timeline_overlapping_link():
    """Step 0: t=11; L0 routed 12.5, miss 0 lands 17 (stall 4.5) -> 20, miss 1 lands 21.5 (stall 1.5) -> 24.5;
    L1 routed 26, lands 30.5 -> 33.5, lands 35 -> 38. Steps 1 and 2: 11 + (1.5 + 3 hit, miss lands 1.5 later
    than the hit ends, + 3) per layer = 29 each. Total 96; stalls 6 + 6 + 4 x 1.5 = 18; link 8 x 4.5 = 36."""
    r = simulate(TINY, LRU2, HAND)
    t = r.timeline
    assert (r.transferred, r.hits) == (8, 4)
    assert t.event_end.tolist() == [24.5, 38.0, 58.0, 67.0, 87.0, 96.0]
    assert t.event_routed.tolist() == [12.5, 26.0, 50.5, 59.5, 79.5, 88.5]
    assert t.event_stall.tolist() == [6.0, 6.0, 1.5, 1.5, 1.5, 1.5]
    assert (t.step_end - t.step_start).tolist() == [38.0, 29.0, 29.0]
    assert (r.time_s, r.output_tokens, r.n_steps) == (96.0, 3, 3)
    assert (r.stall_s, r.link_busy_s) == (18.0, 36.0)
    assert r.stall_share == 18.0 / 96.0 and r.link_busy_share == 36.0 / 96.0
    assert (r.tpot_mean_s, r.tpot_p50_s, r.tpot_p99_s) == (32.0, 29.0, 38.0)
    assert r.tokens_per_s == 3 / 96.0 and r.bytes_per_token == 8 * 4 / 3


def test_hand_derived_timeline_blocking_link_and_serialized_contract():
    """Blocking copies: step 0 = 11 + 2 x (1.5 + 9 + 6) = 44, steps 1-2 = 11 + 2 x (1.5 + 4.5 + 6) = 35.
    Serialized (sequential-ascending LRU gives the same flags here): load, compute, load, compute: the same."""
    blocking = simulate(TINY, LRU2, HardwareProfile(**{**HAND.to_dict(), "overlap": False}))
    serial = simulate(TINY, LRU2, HAND, contract="serialized")
    for r in (blocking, serial):
        assert (r.timeline.step_end - r.timeline.step_start).tolist() == [44.0, 35.0, 35.0]
        assert (r.time_s, r.stall_s) == (114.0, 36.0)
    assert serial.semantics == "sequential-ascending" and serial.transferred == 8


def test_two_copy_channels_share_the_bandwidth():
    """Each transfer takes 0.5 + 4 x 2 / 1 = 8.5 on one of two channels: step 0, layer 0: both misses land at
    21 (stall 8.5), compute 21-24 and 24-27."""
    r = simulate(TINY, LRU2, HardwareProfile(**{**HAND.to_dict(), "copy_streams": 2}))
    assert r.timeline.event_end[0] == 27.0 and r.timeline.event_stall[0] == 8.5


def test_warmup_events_fill_the_cache_but_not_the_clock():
    r = simulate(TINY, ReplayConfig("lru", capacity=(2, 2), tie_break="id", warmup_events=2), HAND)
    assert (r.n_steps, r.output_tokens, r.time_s) == (2, 2, 58.0) and r.transferred == 4


@pytest.mark.parametrize("policy", [p for p in policy_names(advice=False)])
@pytest.mark.parametrize("contract", ["fused", "serialized"])
def test_counts_equal_the_replay_for_every_policy(policy, contract):
    tr = synthesize_trace(SynthConfig(n_layers=3, n_experts=16, top_k=2, n_requests=8, decode_tokens=20,
                                      prefill_tokens=2, seed=4))
    stream, calib = build_events(tr, 4), build_events(synthesize_trace(SynthConfig(
        n_layers=3, n_experts=16, top_k=2, n_requests=8, decode_tokens=20, prefill_tokens=2, seed=5)), 4)
    semantics = "event-atomic" if contract == "fused" else "sequential-ascending"
    cfg = ReplayConfig(policy, rho=0.3, semantics=semantics)
    r = simulate(stream, cfg, load_profile("pcie-gen4-x16"), contract=contract, calibration=calib,
                 expert_bytes=1 << 20)
    want = replay(stream, cfg, calibration=calib)
    assert (r.transferred, r.hits, r.demand_misses, r.initial_load) == \
        (want.transferred, want.hits, want.demand_misses, want.initial_load)
    # the clock only moves forward and every stall is part of the time
    assert np.all(np.diff(r.timeline.event_end) > 0) and 0 <= r.stall_s <= r.time_s


def test_more_misses_never_take_less_time():
    tr = synthesize_trace(SynthConfig(n_layers=2, n_experts=32, top_k=4, n_requests=6, decode_tokens=30, seed=2))
    stream = build_events(tr, 3)
    prof = load_profile("pcie-gen4-x16")
    demand = simulate(stream, ReplayConfig("demand"), prof, expert_bytes=1 << 22)
    lru = simulate(stream, ReplayConfig("lru", rho=0.5), prof, expert_bytes=1 << 22)
    everything = simulate(stream, ReplayConfig("lru", rho=1.0), prof, expert_bytes=1 << 22)
    assert demand.transferred > lru.transferred > everything.transferred
    assert demand.time_s > lru.time_s > everything.time_s


def test_nearest_rank_against_a_naive_expansion():
    rng = np.random.default_rng(0)
    values, weights = rng.random(40), rng.integers(1, 5, 40)
    expanded = np.sort(np.repeat(values, weights))
    for q in (0.01, 0.5, 0.9, 0.99, 1.0):
        assert nearest_rank(values, q, weights) == expanded[int(np.ceil(q * expanded.shape[0])) - 1]


def test_profiles_round_trip_and_bad_ones_are_one_line(tmp_path):
    save_profile(HAND, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == HAND
    cases = {
        "notjson": "{", "list": "[]", "unknown": json.dumps({**HAND.to_dict(), "speed": 1}),
        "missing": json.dumps({"name": "x", "source": "y"}), "negbw": json.dumps({**HAND.to_dict(), "bandwidth": -1}),
        "nanlat": json.dumps({**HAND.to_dict(), "latency_s": "nan"}),
        "streams0": json.dumps({**HAND.to_dict(), "copy_streams": 0}),
        "layers": json.dumps({**HAND.to_dict(), "dense_fixed_s": [1, -2]}),
        "bytes": json.dumps({**HAND.to_dict(), "expert_bytes": 1.5}),
        "overlap": json.dumps({**HAND.to_dict(), "overlap": "yes"}),
    }
    for name, text in cases.items():
        (tmp_path / f"{name}.json").write_text(text)
        with pytest.raises(ValidationError) as err:
            load_profile(tmp_path / f"{name}.json")
        assert f"{name}.json" in str(err.value) and "\n" not in str(err.value), name
    with pytest.raises(ValidationError, match="one per layer"):
        simulate(TINY, LRU2, HardwareProfile(**{**HAND.to_dict(), "dense_fixed_s": (1.0, 2.0, 3.0)}))
    with pytest.raises(ValidationError, match="expert block size is unknown"):
        simulate(TINY, LRU2, HardwareProfile(**{**HAND.to_dict(), "expert_bytes": None}))


def test_cli_prints_policy_rows_and_json(tmp_path):
    TINY.save(tmp_path / "s")
    save_profile(HAND, tmp_path / "hand.json")
    runner = CliRunner()
    res = runner.invoke(main, ["timing", str(tmp_path / "s"), "--policy", "lru,demand", "--capacity", "2",
                               "--tie-break", "id", "--profile", str(tmp_path / "hand.json"), "--json"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.output.splitlines()]
    assert [r["policy"] for r in rows] == ["lru", "demand"]
    assert rows[0]["time_s"] == 96.0 and rows[0]["transferred"] == 8 and rows[1]["transferred"] == 12
    table = runner.invoke(main, ["timing", str(tmp_path / "s"), "--policy", "lru", "--profile", "pcie-gen4-x16",
                                 "--expert-bytes", "1000000"])
    assert table.exit_code == 0 and "TPOT" in table.output and "pcie-gen4-x16" in table.output
    bad = runner.invoke(main, ["timing", str(tmp_path / "s"), "--profile", str(tmp_path / "nope.json")])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1
    nobytes = runner.invoke(main, ["timing", str(tmp_path / "s"), "--profile", "pcie-gen4-x16"])
    assert nobytes.exit_code == 2 and "expert-bytes" in nobytes.output


def test_docs_commands_run_on_the_bundled_example(tmp_path, monkeypatch):
    """The shell lines of docs/timing.md run as written (the profile JSON of the docs too)."""
    import re
    import shlex
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "timing.md").read_text()
    (block,) = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    (profile,) = re.findall(r"```json\n(.*?)```", text, flags=re.S)
    (tmp_path / "my-gpu.json").write_text(profile)
    (tmp_path / "src").symlink_to(root / "src")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for line in block.strip().splitlines():
        args = shlex.split(line.split("#")[0])
        assert args[0] == "expertcache"
        res = runner.invoke(main, args[1:])
        assert res.exit_code == 0, (line, res.output)
    assert (tmp_path / "timeline.png").stat().st_size > 10_000


def test_plot_never_replaces_a_file_without_overwrite(tmp_path):
    TINY.save(tmp_path / "s")
    save_profile(HAND, tmp_path / "hand.json")
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"the user's own figure")
    args = ["timing", str(tmp_path / "s"), "--policy", "lru", "--capacity", "2", "--profile", str(tmp_path / "hand.json"),
            "--plot", str(mine)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and mine.read_bytes() == b"the user's own figure"
    res = CliRunner().invoke(main, [*args, "--overwrite"])
    assert res.exit_code == 0 and mine.read_bytes() != b"the user's own figure"
