"""Prefetch baselines as advice producers, their charging, and `expertcache prefetch compare`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.errors import ValidationError
from expertcache.events import EventStream
from expertcache.prefetch.activation import activation_aware, request_eams
from expertcache.prefetch.comparison import BASELINES, CompareConfig, compare
from expertcache.prefetch.context import advice_context
from expertcache.prefetch.expert_map import expert_map_search
from expertcache.prefetch.options import next_true, option_set
from expertcache.prefetch.predictor import fit_lookahead, lookahead
from expertcache.replay import ReplayConfig, replay
from expertcache.replay.proactive import ProactiveConfig, replay_proactive
from expertcache.trace import DECODE, PREFILL, RoutingTrace
from expertcache.trace.synth import SynthConfig, synthesize_trace


def tiny_trace(rows: list[tuple[int, int, list[list[int]]]], L: int, N: int, k: int) -> RoutingTrace:
    """Rows ``(request, phase, experts[L][k])`` in request-then-position order."""
    req = np.array([r for r, _, _ in rows], dtype=np.int32)
    pos = np.zeros(len(rows), dtype=np.int32)
    for i in range(1, len(rows)):
        pos[i] = pos[i - 1] + 1 if req[i] == req[i - 1] else 0
    n_req = int(req.max()) + 1
    return RoutingTrace(L, N, k, tuple(f"r{i}" for i in range(n_req)), req,
                        np.array([p for _, p, _ in rows], dtype=np.int8), pos,
                        np.array([e for _, _, e in rows], dtype=np.int16), None,
                        np.full(len(rows), -1, dtype=np.int64))


@pytest.fixture(scope="module")
def small():
    return synthesize_trace(SynthConfig(n_layers=6, n_experts=16, top_k=2, n_requests=8, decode_tokens=12,
                                        prefill_tokens=4, working_set=5, seed=4))


# ----------------------------------------------------------------------------------------- context
def test_context_maps_tokens_to_their_events_and_sums_over_active_requests(small):
    for batch, pinit in ((1, False), (1, True), (3, False)):
        ctx = advice_context(small, batch, pinit)
        s = ctx.stream
        assert ctx.count_mask.sum() == build_count(small, batch)
        for x in range(ctx.n_exec):
            for layer in range(small.n_layers):
                e = ctx.exec_event[x, layer]
                assert ctx.count_mask[e] and s.layer[e] == layer
                assert set(small.experts[ctx.exec_row[x], layer].tolist()) <= set(s.members(e).tolist())
        # scatter: event value = sum over its tokens; NaN rows are left out
        out = ctx.empty()
        vals = np.full((ctx.n_exec, small.n_experts), np.nan, dtype=np.float32)
        vals[::2] = 1.0
        ctx.scatter(out, 0, vals)
        per_event = np.bincount(ctx.exec_event[::2, 0], minlength=s.n_events)
        has = per_event > 0
        assert np.all(out[has, 0] == per_event[has]) and np.isnan(out[~has]).all()


def build_count(trace, batch):
    from expertcache.events import build_events

    return build_events(trace, batch).n_events


def test_prefill_init_puts_each_prompt_before_its_decode(small):
    ctx = advice_context(small, 1, True)
    s = ctx.stream
    warm = np.flatnonzero(~ctx.count_mask)
    assert warm.size == small.n_requests * small.n_layers
    # the first L events are request 0's prompt: the union of its prefill routing per layer
    rows = np.flatnonzero((small.request == 0) & (small.phase == PREFILL))
    for layer in range(small.n_layers):
        assert s.members(layer).tolist() == np.unique(small.experts[rows, layer]).tolist()
    with pytest.raises(ValidationError, match="batch 1"):
        advice_context(small, 2, True)


# ---------------------------------------------------------------------------------------- charging
def test_compare_classic_rows_equal_the_main_engine(small):
    rep = compare(small, CompareConfig(capacity=5, prefill_init=False, tie_break="id",
                                       policies=("lru", "lfu", "next-true")))
    ctx = advice_context(rep_eval(small), 1, False)
    for row in rep.rows[:2]:
        want = replay(ctx.stream, ReplayConfig(row.name, capacity=(5,) * small.n_layers, tie_break="id"))
        assert (row.result.hits, row.result.demand_misses, row.result.proactive_loads) == (
            want.hits, want.demand_misses, 0)
    # prefetching exactly the next true experts, victims by LRU: 100% hits, and the proactive loads are
    # exactly the blocks LRU demand-loads (the same cache evolution, every transfer moved ahead of use)
    lru, nt = rep.rows[0].result, rep.rows[2].result
    assert nt.hit == 1.0 and nt.demand_misses == 0
    assert nt.proactive_loads == lru.demand_misses
    assert nt.adj_hit == pytest.approx(nt.accesses / (nt.accesses + nt.proactive_loads))
    assert nt.load_per_token == pytest.approx(lru.load_per_token)


def rep_eval(trace):
    from expertcache.prefetch.comparison import split_trace

    return split_trace(trace)[0]


def test_every_baseline_charges_its_proactive_loads(small):
    rep = compare(small, CompareConfig(capacity=5, budget=3, expert_bytes=1000))
    names = [r.name for r in rep.rows]
    assert names == list(BASELINES)
    for row in rep.rows:
        r = row.result
        assert r.transferred == r.demand_misses + r.proactive_loads
        assert r.load_per_token == pytest.approx((r.demand_misses + r.proactive_loads) * 1000 / r.tokens)
        assert r.adj_hit == pytest.approx((r.accesses - r.demand_misses) / (r.accesses + r.proactive_loads))
        assert r.miss_fraction == pytest.approx(r.transferred / r.logical)
        if row.name in ("lru", "lfu", "lrfu", "least-stale"):
            assert r.proactive_loads == 0 and r.prefetch_budget == 0
        else:
            assert r.prefetch_budget == 3
    res = {r.name: r.result for r in rep.rows}
    for name in ("te-moe", "te-moe-oracle"):
        assert res[name].proactive_loads > 0 and res[name].adj_hit < res[name].hit
    # the option holding the window's own routing raises the hard hit rate above LRU's; AdjHit shows the cost
    assert res["te-moe-oracle"].hit > res["lru"].hit


@pytest.mark.parametrize("jobs", [2, 3, 16])
def test_compare_in_threads_gives_the_rows_of_one_thread(small, jobs, monkeypatch):
    """Baselines side by side (``jobs`` threads, more than the baselines too) give every row of a serial run, in
    its order, with the timing rows; progress is told once per row."""
    import threading

    import expertcache.prefetch.comparison as comparison
    from expertcache.timing import load_profile

    cfg = CompareConfig(capacity=5, budget=3, expert_bytes=1000, batch=2)
    profile = load_profile("pcie-gen4-x16")
    one = compare(small, cfg, profile=profile)
    one_plain = compare(small, cfg)
    seen, where = [], set()
    plain = comparison.replay_proactive

    def noted(*args, **kwargs):
        where.add(threading.current_thread() is threading.main_thread())
        return plain(*args, **kwargs)

    monkeypatch.setattr(comparison, "replay_proactive", noted)
    many = compare(small, cfg, profile=profile, jobs=jobs, progress=seen.append)
    many_plain = compare(small, cfg, jobs=jobs)
    assert [r.name for r in many.rows] == list(BASELINES) and len(seen) == len(BASELINES)
    assert json.dumps(many.to_dict(), sort_keys=True) == json.dumps(one.to_dict(), sort_keys=True)
    assert json.dumps(many_plain.to_dict(), sort_keys=True) == json.dumps(one_plain.to_dict(), sort_keys=True)
    assert where == {False}                 # every row replayed in a worker thread


def test_stream_input_skips_trace_baselines_with_a_reason(small):
    from expertcache.events import build_events

    rep = compare(build_events(small, 2), CompareConfig(rho=0.3))
    skipped = {r.name: r.skipped for r in rep.rows if r.skipped}
    assert set(skipped) == {n for n, b in BASELINES.items() if b.needs_trace}
    assert all("routing trace" in why for why in skipped.values())
    assert all(r.result is not None for r in rep.rows if not r.skipped)


# ---------------------------------------------------------------------------------------- producers
def test_activation_aware_matches_the_nearest_stored_matrix():
    L, N, k = 2, 4, 1
    # calibration: request 0 always uses expert 0 then 1; request 1 always expert 2 then 3
    cal = tiny_trace([(0, PREFILL, [[0], [1]]), (0, DECODE, [[0], [1]]),
                      (1, PREFILL, [[2], [3]]), (1, DECODE, [[2], [3]]), (1, DECODE, [[2], [3]])], L, N, k)
    eams = request_eams(cal)
    assert eams[0].tolist() == [[2, 0, 0, 0], [0, 2, 0, 0]] and eams[1].tolist() == [[0, 0, 3, 0], [0, 0, 0, 3]]
    # evaluated request: its prompt looks like request 1, so its first decode token is advised expert 2 / 3
    ev = tiny_trace([(0, PREFILL, [[2], [3]]), (0, DECODE, [[1], [0]])], L, N, k)
    ctx = advice_context(ev, 1, False)
    p = activation_aware(ctx, cal)
    prio = p.advice.priority
    assert prio[0].tolist() == [0, 0, 1, 0] and prio[1].tolist() == [0, 0, 0, 1]
    pf = p.advice.prefetch_score
    assert pf[0, 2] == 1 and np.isnan(pf[0, [0, 1, 3]]).all()
    assert p.priority == "advice" and p.added_params == 0 and p.store_entries == 2


def hidden_trace(n: int = 600, L: int = 5, N: int = 8, k: int = 2, d_model: int = 24, per_request: int = 20,
                 prompt: int = 0):
    """Random routing; the hidden state at layer l encodes (with noise) the experts of layer l + 3."""
    rng = np.random.default_rng(0)
    experts = np.stack([np.stack([rng.choice(N, k, replace=False) for _ in range(L)]) for _ in range(n)])
    proj = rng.normal(size=(N, d_model))
    hidden = rng.normal(scale=0.05, size=(n, L, d_model))
    for layer in range(L - 3):
        hot = np.zeros((n, N))
        np.put_along_axis(hot, experts[:, layer + 3].astype(np.int64), 1.0, axis=1)
        hidden[:, layer] += hot @ proj
    n_req = n // per_request
    req = np.repeat(np.arange(n_req), per_request).astype(np.int32)
    pos = np.tile(np.arange(per_request), n_req).astype(np.int32)
    phase = np.where(pos < prompt, PREFILL, DECODE).astype(np.int8)
    trace = RoutingTrace(L, N, k, tuple(f"r{i}" for i in range(n_req)), req, phase, pos,
                         experts.astype(np.int16), None, np.full(n, -1, dtype=np.int64))
    return trace, hidden.astype(np.float16), experts


def test_lookahead_learns_a_deterministic_map_from_synthetic_hidden_states():
    """Hidden state at layer l encodes (with noise) the experts of layer l + 3: the predictor must find them."""
    L, N, k, d_model, n = 5, 8, 2, 24, 600
    trace, h16, experts = hidden_trace(n, L, N, k, d_model)
    model = fit_lookahead(trace, 3, h16)
    assert model.feature == "hidden" and model.n_params == 2 * (d_model + 1) * N
    for target in (3, 4):
        pred = model.predict(h16[:, target - 3].astype(np.float32), target)
        top = np.sort(np.argsort(-pred, axis=1)[:, :k], axis=1)
        assert (top == np.sort(experts[:, target], axis=1)).all(axis=1).mean() > 0.95
    # through the replay: hidden features beat the routing stand-in, which carries no signal here
    cal_idx, ev_idx = np.arange(0, n // 20, 2), np.arange(1, n // 20, 2)
    from expertcache.prefetch.produced import request_rows
    from expertcache.trace import select_requests

    cal, ev = select_requests(trace, cal_idx), select_requests(trace, ev_idx)
    ctx = advice_context(ev, 1, False)
    caps = (3,) * L
    res = {}
    for feat in ("hidden", "routing"):
        hv = h16[request_rows(trace, ev_idx)] if feat == "hidden" else None
        hc = h16[request_rows(trace, cal_idx)] if feat == "hidden" else None
        p = lookahead(ctx, cal, 3, hv, hc)
        assert p.details["feature"] == feat
        res[feat] = replay_proactive(ctx.stream, ProactiveConfig("lru", capacity=caps, prefetch_budget=2),
                                     p.advice)
        assert np.isnan(p.advice.prefetch_score[ctx.stream.layer < 3]).all()   # no candidates before l = d
    assert res["hidden"].useful_prefetches > 0.9 * res["hidden"].proactive_loads
    assert res["hidden"].adj_hit > res["routing"].adj_hit


def test_expert_map_search_does_not_depend_on_its_chunk():
    """The advice of the example trace (prompts, so semantics too; gate weights) is the same bit for bit whatever
    the executed tokens' chunk: a token's row depends on that token alone."""
    from pathlib import Path

    import expertcache
    from expertcache.prefetch.comparison import split_trace
    from expertcache.trace import read_trace

    tr = read_trace(str(Path(expertcache.__file__).parent / "data" / "example_trace"))
    ev, cal, _, _ = split_trace(tr)
    ctx = advice_context(ev, 1, True)
    base = expert_map_search(ctx, cal).advice.prefetch_score
    assert ctx.n_exec > 7 and not np.isnan(base).all()
    for chunk in (1, 7, ctx.n_exec - 1, 1 << 20):
        got = expert_map_search(ctx, cal, chunk=chunk).advice.prefetch_score
        assert got.tobytes() == base.tobytes(), chunk


def test_expert_map_search_finds_the_stored_trajectory():
    L, N, k = 3, 6, 1
    cal = tiny_trace([(0, DECODE, [[0], [1], [2]]), (0, DECODE, [[3], [4], [5]])], L, N, k)
    ev = tiny_trace([(0, DECODE, [[3], [4], [5]]), (0, DECODE, [[0], [1], [2]])], L, N, k)
    ctx = advice_context(ev, 1, False)
    p = expert_map_search(ctx, cal, top_m=1, alpha=0.0)
    pf = p.advice.prefetch_score
    # layer 0: no semantics (no prompts) and no trajectory yet -> no candidates
    assert np.isnan(pf[ctx.stream.layer == 0]).all()
    # token 0 at layers 1, 2 follows the stored map (3, 4, 5); token 1 the map (0, 1, 2)
    for x, want in ((0, [4, 5]), (1, [1, 2])):
        for layer in (1, 2):
            row = pf[ctx.exec_event[x, layer]]
            assert np.flatnonzero(~np.isnan(row)).tolist() == [want[layer - 1]]
    assert p.store_entries == 2 and p.added_params == 0


def test_option_set_by_hand():
    # one layer, N = 4, steps 0..3, options of 2 steps
    s = EventStream.from_lists(1, 4, 2, steps=[0, 1, 2, 3], layers=[0] * 4,
                               experts=[[0, 1], [1, 2], [3], [3, 0]], active=[1] * 4)
    fut = option_set(s, 2, "future").advice
    # option 0 = steps 0-1: counts e0 = 1, e1 = 2, e2 = 1; option 1 = steps 2-3: e3 = 2, e0 = 1
    assert fut.prefetch_score[0].tolist() == [1, 2, 1, -np.inf] and fut.prefetch_score[2].tolist() == [
        1, -np.inf, -np.inf, 2]
    assert np.isneginf(fut.prefetch_score[[1, 3]]).all()
    assert fut.priority[1].tolist() == [1, 2, 1, 0] and fut.priority[3].tolist() == [1, 0, 0, 2]
    past = option_set(s, 2, "past").advice
    assert np.isneginf(past.prefetch_score[0]).all() and past.prefetch_score[2].tolist() == [1, 2, 1, -np.inf]
    # replay at c = 3, R = 3, U_B on the option counts:
    #   event 0: candidates e1 (2), e0 (1), e2 (1) (equal scores: lower id first) fill the empty cache, P = 3;
    #            {0, 1} hit. event 1: no candidates; {1, 2} hit.
    #   event 2: candidate e3 (2) vs residents e0 (1), e1 (-inf), e2 (-inf): e1 and e2 tie on the score, the
    #            previous priority row (e1 = 2 > e2 = 1) sends e2 out; P = 4. e0 is resident. {3} hits.
    #   event 3: {3, 0} hit. A = 7, D = 0, P = 4 -> Hit = 100%, AdjHit = 7 / 11.
    r = replay_proactive(s, ProactiveConfig("advice", capacity=(3,), prefetch_budget=3, tie_break="id"), fut)
    assert (r.accesses, r.demand_misses, r.proactive_loads) == (7, 0, 4)
    assert r.hit == 1.0 and r.adj_hit == pytest.approx(7 / 11)


def test_next_true_marks_exactly_the_members():
    s = EventStream.from_lists(2, 4, 2, steps=[0, 0], layers=[0, 1], experts=[[0, 3], [2]], active=[1, 1])
    pf = next_true(s).advice.prefetch_score
    assert np.flatnonzero(~np.isnan(pf[0])).tolist() == [0, 3] and np.flatnonzero(~np.isnan(pf[1])).tolist() == [2]


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_compare_on_the_bundled_example(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["prefetch", "compare", "example", "--json", "--plot", str(tmp_path / "f.png")])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    rows = {r["name"]: r for r in out["rows"]}
    assert set(rows) == set(BASELINES)
    assert out["prefill_init"] is True and out["n_eval_requests"] == 32 and out["budget"] == 12
    assert "routing-derived" in out["hidden"]
    for r in rows.values():
        assert r["skipped"] is None
        assert 0.0 <= r["adj_hit"] <= r["hit"] <= 1.0
        assert r["load_unit"] == "blocks/token"
    assert rows["next-true"]["hit"] == 1.0 and rows["next-true"]["proactive_loads"] > 0
    assert rows["promoe"]["added_params"] > 0 and rows["lru"]["added_params"] == 0
    assert (tmp_path / "f.png").stat().st_size > 0
    table = runner.invoke(main, ["prefetch", "compare", "example", "--policy", "lru,te-moe", "-C", "8"])
    assert table.exit_code == 0 and "AdjHit" in table.output and "te-moe" in table.output


def test_cli_jobs_must_not_be_negative(tmp_path):
    runner = CliRunner()
    for args in (["prefetch", "compare", "example", "--jobs", "-1"],
                 ["report", "--example", "-o", str(tmp_path / "r"), "--jobs", "-1"]):
        res = runner.invoke(main, args)
        assert res.exit_code == 2 and res.output.strip() == "error: --jobs must be >= 0; got -1", res.output
    assert not (tmp_path / "r").exists()


def test_cli_errors_are_one_line(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["prefetch", "compare", str(tmp_path)])
    assert res.exit_code == 2 and "error:" in res.output and "Traceback" not in res.output
    res = runner.invoke(main, ["prefetch", "compare", "example", "--policy", "belady-prefetch"])
    assert res.exit_code == 2 and "unknown baseline" in res.output


def test_cli_reads_collected_hidden_states(tmp_path):
    """A trace directory with a collected "hidden" array (written by the collector's store) feeds the predictors."""
    from expertcache.collect.store import shard_dir, write_shard

    trace, h16, _ = hidden_trace(n=400, prompt=2)
    write_shard(tmp_path, 0, trace, {"hidden": h16})
    res = CliRunner().invoke(main, ["prefetch", "compare", str(shard_dir(tmp_path, 0)), "--policy",
                                    "lru,promoe,finemoe", "-C", "3", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    rows = {r["name"]: r for r in out["rows"]}
    assert out["hidden"] == "hidden states"
    assert rows["promoe"]["details"]["feature"] == "hidden"
    assert rows["finemoe"]["details"]["semantic"] == "mean prompt hidden state"
    assert rows["promoe"]["useful_prefetches"] > 0.8 * rows["promoe"]["proactive_loads"]
    plain = CliRunner().invoke(main, ["prefetch", "compare", str(shard_dir(tmp_path, 0)), "--policy", "promoe",
                                      "-C", "3", "--json", "--no-hidden"])
    assert json.loads(plain.output)["rows"][0]["details"]["feature"] == "routing"


def test_docs_python_blocks_and_commands_run():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "prefetch.md").read_text()
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
        exec(compile(block, "docs/prefetch.md", "exec"), {})
    cmds = re.findall(r"^expertcache (prefetch [a-z]+)", text, flags=re.M)
    assert cmds
    for cmd in set(cmds):
        assert CliRunner().invoke(main, [*cmd.split(), "--help"]).exit_code == 0


def test_cli_replay_reproduces_the_clr_example(tmp_path):
    """The worked example (tests/test_proactive.py) through files and the CLI: A = 2, D = 0, P = 1 with R = 2."""
    from expertcache.nextuse import Advice, save_advice

    s = EventStream.from_lists(1, 6, 1, steps=[0, 1, 2, 3], layers=[0] * 4, experts=[[1], [4], [2], [1]],
                               active=[1] * 4)
    s.save(tmp_path / "s")
    prio = np.tile(np.float32([0.10, 0.55, 0.65, 0.15, 0.40, 0.15]), (4, 1))
    pf = np.full((4, 6), np.nan, dtype=np.float32)
    pf[2] = [0.20, 0.65, 0.70, 0.20, 0.45, 0.35]
    save_advice(Advice(priority=prio, prefetch_score=pf), tmp_path / "a.npz")
    res = CliRunner().invoke(main, ["prefetch", "replay", str(tmp_path / "s"), "--advice", str(tmp_path / "a.npz"),
                                    "--priority", "advice,lru", "-R", "0,2", "-C", "2", "--warmup", "2",
                                    "--tie-break", "id", "--json"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.output.splitlines()]
    got = {(r["priority"], r["prefetch_budget"]): (r["accesses"], r["demand_misses"], r["proactive_loads"])
           for r in rows}
    assert got == {("advice", 0): (2, 1, 0), ("advice", 2): (2, 0, 1), ("lru", 0): (2, 2, 0), ("lru", 2): (2, 0, 1)}
    adv2 = next(r for r in rows if r["priority"] == "advice" and r["prefetch_budget"] == 2)
    assert adv2["hit"] == 1.0 and adv2["adj_hit"] == pytest.approx(2 / 3)
    table = CliRunner().invoke(main, ["prefetch", "replay", str(tmp_path / "s"), "-C", "2"])
    assert table.exit_code == 0 and "AdjHit" in table.output
    bad = CliRunner().invoke(main, ["prefetch", "replay", str(tmp_path / "s"), "--priority", "advice", "-C", "2"])
    assert bad.exit_code == 2 and "reads advice" in bad.output


def test_expert_map_search_weighs_maps_by_gates():
    """Both stored maps use experts {0, 1} at layer 0; only the gate weights tell them apart.

    The evaluated token's gates (0.15, 0.85) are nearer map B (0.1, 0.9) than map A (0.9, 0.1), so layer 1 is
    predicted from B ({0, 1}); without gates the two tie and the first stored map (A: {2, 3}) would win.
    """
    L, N, k = 2, 4, 2

    def gated(rows, gates):
        t = tiny_trace(rows, L, N, k)
        return RoutingTrace(L, N, k, t.request_ids, t.request, t.phase, t.position, t.experts,
                            np.array(gates, dtype=np.float32), t.token_id)

    cal = gated([(0, DECODE, [[0, 1], [2, 3]]), (0, DECODE, [[0, 1], [0, 1]])],
                [[[0.9, 0.1], [0.5, 0.5]], [[0.1, 0.9], [0.5, 0.5]]])
    ev = gated([(0, DECODE, [[0, 1], [0, 1]])], [[[0.15, 0.85], [0.5, 0.5]]])
    ctx = advice_context(ev, 1, False)
    p = expert_map_search(ctx, cal, top_m=1, alpha=0.0)
    assert p.details["maps"] == "gate weights"
    row = p.advice.prefetch_score[ctx.exec_event[0, 1]]
    assert np.flatnonzero(~np.isnan(row)).tolist() == [0, 1]
    plain = expert_map_search(advice_context(tiny_trace([(0, DECODE, [[0, 1], [0, 1]])], L, N, k), 1, False),
                              cal, top_m=1, alpha=0.0)
    assert plain.details["maps"] == "multi-hot"
    assert np.flatnonzero(~np.isnan(plain.advice.prefetch_score[1])).tolist() == [2, 3]


def test_a_prefill_initialised_stream_counts_decode_only(small, tmp_path):
    """A stream from `events build --prefill-init` declares its warm-up; compare and `prefetch replay` honour it
    as `expertcache replay` does (regression: both counted the prefill events and their prompt tokens)."""
    from expertcache.events.prefill import prefill_initialised_events

    stream = prefill_initialised_events(small, 1, chunk=2)
    warm = stream.provenance["warmup_events"]
    assert warm > 0
    want = replay(stream, ReplayConfig("lru", capacity=(5,) * small.n_layers, tie_break="id", warmup_events=warm))
    decode_tokens = int((small.phase == DECODE).sum())
    rep = compare(stream, CompareConfig(capacity=5, tie_break="id", policies=("lru", "next-true")))
    lru = rep.rows[0].result
    assert rep.warmup_events == warm and rep.prefill_init
    assert (lru.accesses, lru.demand_misses, lru.tokens) == (want.union, want.demand_misses, decode_tokens)
    stream.save(tmp_path / "s")
    res = CliRunner().invoke(main, ["prefetch", "replay", str(tmp_path / "s"), "-C", "5", "--tie-break", "id",
                                    "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert (got["warmup_events"], got["demand_misses"], got["tokens"]) == (warm, want.demand_misses, decode_tokens)
    cold = CliRunner().invoke(main, ["prefetch", "replay", str(tmp_path / "s"), "-C", "5", "--warmup", "0", "--json"])
    assert json.loads(cold.output)["tokens"] > decode_tokens


def test_compare_and_replay_reject_out_of_range_lists_and_rho(tmp_path):
    runner = CliRunner()
    for args in (["--rho", "2"], ["--rho", "-0.5"], ["--policy", ",,"]):
        res = runner.invoke(main, ["prefetch", "compare", "example", *args])
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert ("rho" in res.output) or ("at least one" in res.output)
    EventStream.from_lists(1, 4, 1, steps=[0], layers=[0], experts=[[0]], active=[1]).save(tmp_path / "s")
    res = runner.invoke(main, ["prefetch", "replay", str(tmp_path / "s"), "--priority", ","])
    assert res.exit_code == 2 and "retention keys" in res.output


@pytest.mark.parametrize("seed", range(6))
def test_top_m_rows_equals_the_stable_argsort(seed):
    """FineMoE's best-map selection: the partition-based top m is the stable full sort's first m, ties included."""
    from expertcache.prefetch.expert_map import top_m_rows

    rng = np.random.default_rng(seed)
    n, width = 40, int(rng.integers(1, 30))
    sim = rng.choice(np.array([-1.0, 0.0, 0.25, 0.5, 1.0]), size=(n, width))     # few values: many ties
    sim[: n // 4] = rng.random((n // 4, width))
    sim[-1] = 0.5                                                                  # one row all tied
    for m in range(0, width + 2):
        want = np.argsort(-sim, axis=1, kind="stable")[:, :m]
        np.testing.assert_array_equal(top_m_rows(sim, m), want)


def test_routing_features_fit_equals_the_dense_normal_equations(small):
    """The routing-feature predictor is fitted from co-occurrence counts; the dense path (the same multi-hot
    features passed as 'hidden states') must give the very same maps."""
    L, N = small.n_layers, small.n_experts
    dense_features = np.zeros((small.n_tokens, L, N), dtype=np.float32)
    for layer in range(L):
        np.put_along_axis(dense_features[:, layer], small.experts[:, layer].astype(np.int64), 1.0, axis=1)
    counted = fit_lookahead(small, 2)
    dense = fit_lookahead(small, 2, hidden=dense_features, chunk=7)
    assert counted.feature == "routing" and dense.feature == "hidden"
    assert sorted(counted.weights) == sorted(dense.weights) == list(range(2, L))
    for target in counted.weights:
        np.testing.assert_allclose(counted.weights[target], dense.weights[target], rtol=1e-5, atol=1e-6)


def test_every_producer_fills_the_prefill_warm_up_alike(small):
    """Prefill events (uncounted) carry priority = member multiplicity and no candidates for every producer, so
    every row starts its decode from a cache the prefill filled by one rule (regression: te-moe left NaN
    priorities there, next-true prefetched during the prefill)."""
    from expertcache.prefetch.comparison import split_trace

    ev, cal, _, _ = split_trace(small)
    ctx = advice_context(ev, 1, True)
    s, warm = ctx.stream, np.flatnonzero(~ctx.count_mask)
    want = np.zeros((warm.size, s.n_experts), dtype=np.float32)
    for j, i in enumerate(warm):
        lo, hi = s.offsets[i], s.offsets[i + 1]
        want[j, s.expert[lo:hi]] = s.multiplicity[lo:hi]
    produced = [activation_aware(ctx, cal), option_set(s, 2, "past", ctx.count_mask),
                option_set(s, 2, "future", ctx.count_mask), lookahead(ctx, cal, 2), next_true(s, ctx.count_mask)]
    for p in produced:
        if p.advice.priority is not None:
            np.testing.assert_array_equal(p.advice.priority[warm], want)
        assert np.all(p.advice.prefetch_score[warm] == -np.inf)
        assert not np.all(p.advice.prefetch_score[ctx.count_mask] == -np.inf)


def test_routing_semantic_embedding_is_the_unit_prompt_histogram(small):
    """FineMoE's stand-in semantics without hidden states: the prompt's one-hot routing summed, made unit length."""
    from expertcache.prefetch.expert_map import semantic_embeddings
    from expertcache.prefetch.produced import multi_hot

    L, N = small.n_layers, small.n_experts
    want = np.zeros((small.n_requests, L * N))
    for r in range(small.n_requests):
        rows = np.flatnonzero((small.phase == PREFILL) & (small.request == r))
        want[r] = multi_hot(small.experts[rows].reshape(-1, small.top_k), N).reshape(rows.size, L * N).sum(0)
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    np.testing.assert_array_equal(semantic_embeddings(small, None), want.astype(np.float32))


def test_semantic_similarity_is_the_cosine_summed_in_feature_order():
    """Exact on whole-number (histogram) vectors; on real vectors, the float64 sums of products in feature order
    (summed by hand here); 0 against a zero vector."""
    import math

    from expertcache.prefetch.expert_map import semantic_similarity

    rng = np.random.default_rng(5)
    a, b = rng.integers(0, 9, (4, 40)), rng.integers(0, 9, (6, 40))
    a[1] = 0
    got = semantic_similarity(a.astype(np.float64), b.astype(np.float64))
    for r in range(4):
        for c in range(6):
            na, nb = int(a[r] @ a[r]), int(b[c] @ b[c])
            want = int(a[r] @ b[c]) / math.sqrt(na * nb) if na * nb else 0.0
            assert got[r, c] == want
    a, b = rng.standard_normal((3, 33)), rng.standard_normal((5, 33))
    a[0, ::2] = 0.0
    got = semantic_similarity(a, b)
    for r in range(3):
        for c in range(5):
            dot = na = nb = 0.0
            for f in range(33):
                dot += a[r, f] * b[c, f]
                na += a[r, f] * a[r, f]
                nb += b[c, f] * b[c, f]
            assert got[r, c] == dot / math.sqrt(na * nb)


def test_prefetch_advice_command_writes_what_prefetch_replay_reads(tmp_path):
    """`prefetch advice` makes advice from a stream alone; next-true with R >= k and c >= k hits every access
    (each event's experts are loaded before it: D = 0, and every proactive load is used), by hand."""
    from expertcache.events import build_events
    from expertcache.nextuse import load_advice

    tr = synthesize_trace(SynthConfig(n_layers=2, n_experts=8, top_k=2, n_requests=3, decode_tokens=5,
                                      working_set=4, seed=4))
    s = build_events(tr, 1)
    s.save(tmp_path / "s")
    run = CliRunner().invoke
    res = run(main, ["prefetch", "advice", str(tmp_path / "s"), "--producer", "next-true", "-o",
                     str(tmp_path / "a.npz"), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["fields"] == ["prefetch_score"] and info["replay_priority"] == "lru"
    adv = load_advice(tmp_path / "a.npz")
    assert np.array_equal(np.isfinite(adv.prefetch_score).sum(axis=1), np.diff(s.offsets))
    rep = run(main, ["prefetch", "replay", str(tmp_path / "s"), "--advice", str(tmp_path / "a.npz"), "-R", "2",
                     "-C", "2", "--json"])
    assert rep.exit_code == 0, rep.output
    r = json.loads(rep.output.strip().splitlines()[-1])
    assert r["demand_misses"] == 0 and r["hit"] == 1.0 and r["useful_prefetches"] == r["proactive_loads"] > 0
    te = run(main, ["prefetch", "advice", str(tmp_path / "s"), "-o", str(tmp_path / "t.npz")])
    assert te.exit_code == 0 and "--priority advice" in te.output
    assert load_advice(tmp_path / "t.npz").fields_present() == ("priority", "prefetch_score")
    for args, needle in ((["-o", str(tmp_path / "a.npz")], "exists"), (["-o", str(tmp_path / "x.txt")], ".npz")):
        bad = run(main, ["prefetch", "advice", str(tmp_path / "s"), *args])
        assert bad.exit_code == 2 and needle in bad.output and "Traceback" not in bad.output


#: Run in a child: FineMoE's advice on the bundled traces (routing-histogram semantics) and on the example-model
#: trace with seeded stand-in hidden states (mean-hidden-state semantics), one digest per case.
_FINEMOE_DIGESTS = """
import hashlib
from pathlib import Path
import numpy as np
import expertcache
from expertcache.prefetch.comparison import request_rows, split_trace
from expertcache.prefetch.context import advice_context
from expertcache.prefetch.expert_map import expert_map_search
from expertcache.trace import read_trace

data = Path(expertcache.__file__).parent / "data"
for name in ("example_model_trace", "example_trace", "example_model_trace+hidden"):
    tr = read_trace(str(data / name.split("+")[0]))
    ev, cal, ev_idx, cal_idx = split_trace(tr)
    kw = {}
    if name.endswith("+hidden"):
        h = np.random.default_rng(0).standard_normal((tr.n_tokens, tr.n_layers, 48)).astype(np.float32)
        kw = {"hidden": h[request_rows(tr, ev_idx)], "hidden_calibration": h[request_rows(tr, cal_idx)]}
    p = expert_map_search(advice_context(ev, 1, True), cal, **kw)
    print(name, hashlib.sha256(p.advice.prefetch_score.tobytes()).hexdigest())
"""


def _openblas_core_types() -> list[str]:
    """OpenBLAS kernels this machine can be made to run (``OPENBLAS_CORETYPE``); none where it cannot."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    except Exception:       # noqa: BLE001 - an older numpy: no machine-readable configuration
        return []
    if "openblas" not in str(blas.get("name", "")).lower() or "DYNAMIC_ARCH" not in str(blas.get("openblas "
                                                                                                "configuration")):
        return []
    try:
        flags = set(next(ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")).split(":")[1].split())
    except (OSError, StopIteration):
        return []
    return [t for t, need in (("Haswell", {"avx2", "fma"}), ("Sandybridge", {"avx"})) if need <= flags]


def test_finemoe_advice_does_not_depend_on_the_machine(tmp_path):
    """FineMoE's similarities are float64 sums in a fixed order (no BLAS): forcing OpenBLAS onto other kernels
    (other SIMD widths, blockings, FMA or not), one thread, or numba onto a generic x86-64 (SSE2 code, the kernels
    compiled afresh) leaves every advice bit the same (regression: the float32 BLAS product of the semantic
    embeddings moved `prefetch compare`'s finemoe row between machines, e.g. 250,046 vs 250,023 proactive loads
    on the bundled example)."""
    import os
    import subprocess
    import sys

    runs = ([{}] + [{"OPENBLAS_CORETYPE": t} for t in _openblas_core_types()] + [{"OPENBLAS_NUM_THREADS": "1"}]
            + [{"NUMBA_CPU_NAME": "generic", "NUMBA_CACHE_DIR": str(tmp_path / "numba")}])
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS_", "NUMBA_CPU"))}
    out = []
    for extra in runs:
        proc = subprocess.run([sys.executable, "-c", _FINEMOE_DIGESTS], env={**base, **extra}, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        out.append(proc.stdout)
    assert len(out[0].splitlines()) == 3
    for extra, got in zip(runs[1:], out[1:], strict=True):
        assert got == out[0], f"advice differs under {extra}"
