"""The timing model: a hand-derived timeline matched exactly, counts equal to the replay, profiles, the command."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.errors import ValidationError
from expertcache.events import EventStream, build_events
from expertcache.nextuse import Advice
from expertcache.replay import ReplayConfig, policy_names, replay
from expertcache.replay.proactive import ProactiveConfig, replay_proactive
from expertcache.timing import HardwareProfile, load_profile, save_profile, simulate
from expertcache.timing.model import nearest_rank
from expertcache.timing.prefetch import simulate_prefetch
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


# Prefetches. Two layers, three steps, top-1, one slot per layer, LRU (ties: lower id kept), R = 1:
#   events  e0 s0L0 {0}  e1 s0L1 {0}  e2 s1L0 {1}  e3 s1L1 {1}  e4 s2L0 {0}  e5 s2L1 {2}
#   advice  e2: prefetch 1 (replaces 0, then hit: useful)   e3: prefetch 3 (replaces 0; e3 misses 1, and the
#   update keeps 1 over 3 (equal LRU stamps, lower id): 3 leaves unused: useless)   e5: prefetch 2 (replaces 1,
#   then hit: useful). Demand misses: e0, e1, e3, e4 (4); hits e2, e5; P = 3.
PF_STREAM = EventStream.from_lists(n_layers=2, n_experts=4, top_k=1, steps=[0, 0, 1, 1, 2, 2], layers=[0, 1] * 3,
                                   experts=[[0], [0], [1], [1], [0], [2]], active=[1] * 6)
#: step 1; dense 3 (layer 0) and 1 (layer 1); expert 2; a transfer 5 B / 1 B/s = 5
PF_HAND = HardwareProfile("pf-hand", "hand-made for the test", bandwidth=1.0, expert_bytes=5,
                          dense_fixed_s=(3.0, 1.0), expert_fixed_s=2.0, step_fixed_s=1.0)
PF_CFG = ProactiveConfig("lru", capacity=(1, 1), prefetch_budget=1, tie_break="id")


def _pf_advice() -> Advice:
    pf = np.full((6, 4), np.nan, dtype=np.float32)
    pf[2, 1] = pf[3, 3] = pf[5, 2] = 1.0
    return Advice(prefetch_score=pf)


def test_hand_derived_prefetch_timeline_prev_layer():
    """Issued when the previous layer's routing is known, behind that event's own miss (one channel):
    s0 (t=1): e0 routed 4, miss lands 9 (stall 5), ends 11; e1 routed 12, miss lands 17 (stall 5), ends 19;
      e2's prefetch issued at 12, starts 17, lands 22.
    s1 (t=20): e2 routed 23 > 22: TIMELY, ends 25; e3's prefetch issued at 23, lands 28; e3 routed 26, its miss
      waits for the link until 28, lands 33 (stall 7: the useless prefetch cost 2), ends 35.
    s2 (t=36): e4 routed 39, miss lands 44 (stall 5), ends 46; e5's prefetch issued at 39 behind it: starts 44,
      lands 49; e5 routed 47: LATE, waits 2, ends 51.
    Steps 19, 16, 16; stall 24; link 7 x 5 = 35."""
    r = simulate_prefetch(PF_STREAM, PF_CFG, PF_HAND, _pf_advice())
    t = r.timeline
    assert t.event_routed.tolist() == [4.0, 12.0, 23.0, 26.0, 39.0, 47.0]
    assert t.event_end.tolist() == [11.0, 19.0, 25.0, 35.0, 46.0, 51.0]
    assert t.event_stall.tolist() == [5.0, 5.0, 0.0, 7.0, 5.0, 2.0]
    assert (t.step_end - t.step_start).tolist() == [19.0, 16.0, 16.0]
    assert (r.time_s, r.stall_s, r.link_busy_s) == (51.0, 24.0, 35.0)
    assert (r.transferred, r.demand_misses, r.hits, r.prefetch_loads) == (7, 4, 2, 3)
    assert (r.prefetch_timely, r.prefetch_late, r.prefetch_useless, r.prefetch_late_stall_s) == (1, 1, 1, 2.0)
    assert r.bytes_per_token == 7 * 5 / 3 and r.issue == "prev-layer"


def test_hand_derived_prefetch_timeline_prev_token_and_blocking_link():
    """prev-token: a step's prefetches are issued when the previous step ends.
    s0 as above, ends 19. s1: at 19 e2's prefetch (lands 24) and e3's (lands 29); t=20; e2 routed 23: LATE,
      waits 1, ends 26; e3 routed 27, miss behind the prefetch lands 34 (stall 7), ends 36.
    s2: at 36 e5's prefetch lands 41; t=37; e4 routed 40, miss lands 46 (stall 6), ends 48; e5 routed 49: TIMELY,
      ends 51.
    Blocking link, prev-layer: every copy is made by the compute unit when issued: e1 copies its miss and e2's
    prefetch (stall 10) and ends 24; s1 t=25, e2 routed 28, copies e3's prefetch to 33, ends 35; e3 routed 36,
    miss to 41, ends 43; s2 t=44, e4 routed 47, miss + e5's prefetch to 57, ends 59; e5 routed 60, ends 62.
    Both useful prefetches are timely (nothing is ever in flight), and cost 5 each: without them 6 misses, 57."""
    r = simulate_prefetch(PF_STREAM, PF_CFG, PF_HAND, _pf_advice(), issue="prev-token")
    assert r.timeline.event_end.tolist() == [11.0, 19.0, 26.0, 36.0, 48.0, 51.0]
    assert r.timeline.event_stall.tolist() == [5.0, 5.0, 1.0, 7.0, 6.0, 0.0]
    assert (r.prefetch_timely, r.prefetch_late, r.prefetch_useless, r.prefetch_late_stall_s) == (1, 1, 1, 1.0)
    blocking = HardwareProfile(**{**PF_HAND.to_dict(), "dense_fixed_s": (3.0, 1.0), "overlap": False})
    b = simulate_prefetch(PF_STREAM, PF_CFG, blocking, _pf_advice())
    assert b.timeline.event_end.tolist() == [11.0, 24.0, 35.0, 43.0, 59.0, 62.0]
    assert b.timeline.event_stall.tolist() == [5.0, 10.0, 5.0, 5.0, 10.0, 0.0]
    assert (b.time_s, b.stall_s, b.prefetch_timely, b.prefetch_late, b.prefetch_useless) == (62.0, 35.0, 2, 0, 1)
    none = simulate(PF_STREAM, ReplayConfig("lru", capacity=(1, 1), tie_break="id"), blocking)
    assert (none.time_s, none.transferred) == (57.0, 6)


def test_prefetch_timeline_without_prefetches_is_the_plain_timeline():
    """R = 0: the prefetch kernel reproduces simulate's timeline event for event (overlap, blocking, 2 channels)."""
    tr = synthesize_trace(SynthConfig(n_layers=3, n_experts=16, top_k=2, n_requests=6, decode_tokens=15, seed=7))
    stream = build_events(tr, 3)
    base = load_profile("pcie-gen4-x16")
    for prof in (base, HardwareProfile(**{**base.to_dict(), "overlap": False}),
                 HardwareProfile(**{**base.to_dict(), "copy_streams": 2})):
        got = simulate_prefetch(stream, ProactiveConfig("lru", rho=0.3, tie_break="id"), prof, expert_bytes=1 << 20)
        want = simulate(stream, ReplayConfig("lru", rho=0.3, tie_break="id"), prof, expert_bytes=1 << 20)
        assert np.array_equal(got.timeline.event_end, want.timeline.event_end)
        assert np.array_equal(got.timeline.event_stall, want.timeline.event_stall)
        assert (got.time_s, got.transferred, got.hits) == (want.time_s, want.transferred, want.hits)


@pytest.mark.parametrize("priority,issue", [("lru", "prev-layer"), ("lfu", "prev-layer:2"),
                                            ("advice", "prev-token"), ("lrfu", "prev-layer")])
def test_prefetch_counts_equal_the_proactive_replay(priority, issue):
    """The timing run's D, P, hits and useful prefetches are the proactive replay's (random advice, warm-up)."""
    tr = synthesize_trace(SynthConfig(n_layers=3, n_experts=16, top_k=2, n_requests=8, decode_tokens=20,
                                      prefill_tokens=2, seed=4))
    stream = build_events(tr, 4)
    rng = np.random.default_rng(1)
    pf = rng.random((stream.n_events, 16)).astype(np.float32)
    pf[pf < 0.6] = np.nan
    advice = Advice(priority=rng.random((stream.n_events, 16)).astype(np.float32), prefetch_score=pf)
    cfg = ProactiveConfig(priority, rho=0.3, prefetch_budget=3, warmup_events=6)
    r = simulate_prefetch(stream, cfg, load_profile("pcie-gen4-x16"), advice, issue=issue, expert_bytes=1 << 20)
    want = replay_proactive(stream, cfg, advice)
    assert want.proactive_loads > 0 and 0 < want.useful_prefetches < want.proactive_loads
    assert (r.transferred, r.demand_misses, r.hits, r.prefetch_loads) == \
        (want.transferred, want.demand_misses, want.hits, want.proactive_loads)
    assert r.prefetch_timely + r.prefetch_late == want.useful_prefetches
    assert r.prefetch_useless == want.wasted_prefetches
    assert r.output_tokens == want.tokens and 0 <= r.stall_s <= r.time_s


def test_prefetch_issue_points_are_validated():
    with pytest.raises(ValidationError, match="layer distance"):
        simulate_prefetch(PF_STREAM, PF_CFG, PF_HAND, _pf_advice(), issue="prev-layer:2")
    with pytest.raises(ValidationError, match="issue must be"):
        simulate_prefetch(PF_STREAM, PF_CFG, PF_HAND, _pf_advice(), issue="soon")


def test_cli_times_prefetches_from_an_advice_file(tmp_path):
    """`timing STREAM --advice FILE --priority K -R N`: the hand-derived prefetch run, and one-line refusals."""
    from expertcache.nextuse import save_advice

    PF_STREAM.save(tmp_path / "s")
    save_advice(_pf_advice(), tmp_path / "a.npz")
    save_profile(PF_HAND, tmp_path / "p.json")
    runner = CliRunner()
    base = ["timing", str(tmp_path / "s"), "--capacity", "1", "--tie-break", "id", "--profile", str(tmp_path / "p.json")]
    res = runner.invoke(main, [*base, "--advice", str(tmp_path / "a.npz"), "-R", "0,1", "--json"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.output.splitlines()]
    assert [(r["prefetch_budget"], r["transferred"], r["prefetch_loads"]) for r in rows] == [(0, 6, 0), (1, 7, 3)]
    assert (rows[1]["time_s"], rows[1]["prefetch_timely"], rows[1]["prefetch_late"], rows[1]["prefetch_useless"]) \
        == (51.0, 1, 1, 1)
    # `prefetch replay` on the same stream and advice counts the same transfers
    pr = runner.invoke(main, ["prefetch", "replay", str(tmp_path / "s"), "--advice", str(tmp_path / "a.npz"),
                              "-R", "0,1", "-C", "1", "--tie-break", "id", "--json"])
    assert pr.exit_code == 0, pr.output
    want = [json.loads(line) for line in pr.output.splitlines()]
    assert [(w["transferred"], w["demand_misses"], w["proactive_loads"], w["useful_prefetches"]) for w in want] == \
        [(r["transferred"], r["demand_misses"], r["prefetch_loads"], r["prefetch_timely"] + r["prefetch_late"])
         for r in rows]
    table = runner.invoke(main, [*base, "--advice", str(tmp_path / "a.npz"), "-R", "1", "--issue", "prev-token",
                                 "--plot", str(tmp_path / "pf.png")])
    assert table.exit_code == 0 and "timely" in table.output and "prev-token" in table.output, table.output
    assert (tmp_path / "pf.png").stat().st_size > 5_000
    for extra, words in ((["--policy", "lru"], "--priority"), (["--scope", "global"], "per-layer"),
                         (["--contract", "serialized"], "fused"), (["--issue", "later"], "issue must be"),
                         (["-R", "x"], "--budget"), (["--priority", "advice"], "advice")):
        bad = runner.invoke(main, [*base, "--advice", str(tmp_path / "a.npz"), *extra])
        assert bad.exit_code == 2 and words in bad.output and len(bad.output.strip().splitlines()) == 1, \
            (extra, bad.output)


def test_prefetch_compare_with_a_profile_times_each_row_at_its_availability():
    """`compare(..., profile=P)`: the same counts as without, each row's timing equal to simulate_prefetch at the
    issue point its decision availability names."""
    from expertcache.prefetch.comparison import CompareConfig, compare
    from expertcache.timing.prefetch import issue_for_availability
    from expertcache.trace import read_trace

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    trace = read_trace(root / "src/expertcache/data/example_model_trace")
    cfg = CompareConfig(capacity=8, policies=("lru", "moe-infinity", "promoe", "te-moe", "next-true"),
                        tie_break="id", expert_bytes=98_304)
    prof = load_profile("pcie-gen4-x16")
    plain, timed = compare(trace, cfg), compare(trace, cfg, profile=prof)
    issues = {}
    for a, b in zip(plain.rows, timed.rows, strict=True):
        assert a.result == b.result and a.timing is None
        t = b.timing
        assert (t.transferred, t.demand_misses, t.prefetch_loads) == \
            (b.result.transferred, b.result.demand_misses, b.result.proactive_loads)
        assert t.prefetch_timely + t.prefetch_late == b.result.useful_prefetches
        issues[b.name] = t.issue if t.prefetch_budget else None
        assert b.to_dict()["timing"]["tpot_mean_s"] == t.tpot_mean_s
    assert issues == {"lru": None, "moe-infinity": "prev-token", "promoe": "prev-layer:3", "te-moe": "prev-token",
                      "next-true": "prev-layer"}
    assert issue_for_availability("option start (future routing: upper bound)") == "prev-token"
    assert issue_for_availability("Prev. layer (h_(l-1)) + Curr. layer") == "prev-layer"
