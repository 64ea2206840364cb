"""Deadline rotation: the window holds, nobody starves, and A = B is continuous batching."""

from __future__ import annotations

import numpy as np
import pytest

from expertcache.events import ArrivalOffsets, build_events
from expertcache.events.rotation import (
    SCHEDULERS,
    RotationConfig,
    rotation_events,
    rotation_schedule,
)
from expertcache.trace import DECODE, select_requests
from expertcache.trace.synth import SynthConfig, synthesize_trace


def _trace(seed: int, n_requests: int = 14):
    tr = synthesize_trace(SynthConfig(n_layers=2, n_experts=16, top_k=2, n_requests=n_requests, decode_tokens=12,
                                      working_set=4, seed=seed))
    # ragged lengths: keep a different number of decode tokens per request
    rng = np.random.default_rng(seed)
    keep = np.concatenate([np.flatnonzero(tr.request == r)[: rng.integers(3, 13)] for r in range(n_requests)])
    from expertcache.trace import RoutingTrace

    return RoutingTrace(tr.n_layers, tr.n_experts, tr.top_k, tr.request_ids, tr.request[keep], tr.phase[keep],
                        tr.position[keep], tr.experts[keep], tr.gates[keep], tr.token_id[keep], tr.provenance)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("A, B, W", [(6, 2, 3), (8, 3, 3), (5, 5, 1), (9, 3, 4), (12, 3, 4), (7, 2, 4), (4, 1, 4)])
def test_window_holds_and_nobody_starves(scheduler, A, B, W):
    for seed in range(6):
        tr = _trace(seed)
        offs = ArrivalOffsets.parse("random:0:10", seed=seed)
        step, req, tok, stats = rotation_schedule(tr, RotationConfig(A, B, W, scheduler), offs)
        assert stats.max_interval <= W and stats.deadline_violations == 0
        # every decode token of every request is executed exactly once, in order
        lengths = np.bincount(tr.request[tr.phase == DECODE], minlength=tr.n_requests)
        for r in range(tr.n_requests):
            assert tok[req == r].tolist() == list(range(lengths[r]))
        assert np.bincount(step).max() <= B
        # admitted sessions never exceed A at any step
        assert len(step) == lengths.sum()


@pytest.mark.parametrize("offsets", ["zero", "stagger:3", "random:0:20"])
def test_rotation_with_a_equal_b_is_continuous_batching(offsets):
    tr = _trace(7)
    for B in (1, 3, 5):
        offs = ArrivalOffsets.parse(offsets, seed=2)
        a = build_events(tr, B, offs)
        b, _ = rotation_events(tr, RotationConfig(B, B, 1), offs)
        for name in ("step", "layer", "active", "offsets", "expert", "multiplicity"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), (B, name)


def test_rotation_reports_service_statistics():
    tr = select_requests(_trace(3), range(10))
    _, stats = rotation_events(tr, RotationConfig(6, 2, 3, "causal_prev_route"))
    assert 1 <= stats.mean_batch <= 2
    assert stats.p99_latency_steps >= 1
    with pytest.raises(Exception, match="batch <= admitted"):
        RotationConfig(2, 4, 3)


def test_oracle_union_is_never_worse_than_causal_on_the_same_candidates():
    from expertcache.events.rotation import _union_cost, select_batch

    rng = np.random.default_rng(0)
    L, N, k = 3, 24, 4
    for trial in range(200):
        n = int(rng.integers(5, 14))
        admitted = list(range(n))
        s = 10
        last = {r: int(s - rng.integers(1, 4)) for r in admitted}
        order = {r: r for r in admitted}
        true = {r: np.stack([rng.choice(N, size=k, replace=False) for _ in range(L)]) for r in admitted}
        prev = {r: (None if rng.random() < 0.2 else np.stack([rng.choice(N, size=k, replace=False)
                                                              for _ in range(L)])) for r in admitted}
        cfgs = {name: RotationConfig(n + 2, 4, 4, name) for name in ("causal_prev_route", "oracle_current_route")}
        picks = {name: select_batch(c, s, admitted, last, order, prev, lambda rs, t=true: {r: t[r] for r in rs}, L, k)
                 for name, c in cfgs.items()}
        cost = {name: _union_cost([true[r] for r in p], L) for name, p in picks.items()}
        assert cost["oracle_current_route"] <= cost["causal_prev_route"], trial
        assert len(picks["oracle_current_route"]) == len(picks["causal_prev_route"]) == 4


def test_affinity_command_prints_scope_and_table(tmp_path):
    import json

    from click.testing import CliRunner

    from expertcache.cli import main

    tr = _trace(5, n_requests=16)
    tr.save(tmp_path / "t")
    res = CliRunner().invoke(main, ["affinity", str(tmp_path / "t"), "-A", "6", "-B", "2", "-W", "3",
                                    "--best-of", "20", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["scope"]["fairness"].startswith("W = 3") and out["scope"]["lossless"] is True
    assert {r["policy"] for r in out["rows"]} == {"lfru", "static"}   # frozen static is the default (§8.3)
    assert all(st["deadline_violations"] == 0 for st in out["stats"].values())
    assert 0 <= out["best_of_n_upper_bound"] < 1
    res = CliRunner().invoke(main, ["affinity", str(tmp_path / "t"), "-A", "6", "-B", "2", "-W", "3",
                                    "--best-of", "10"])
    assert res.exit_code == 0 and "UPPER BOUND" in res.output


def _greedy_twin(cands, base, sets, k, n_layers, order_key, top_k):
    """The greedy as it was written before its kernel: Python sets, one layer at a time."""
    chosen = list(base)
    union = [set() for _ in range(n_layers)]
    for r in base:
        if sets[r] is not None:
            for layer in range(n_layers):
                union[layer].update(sets[r][layer].tolist())
    pool = [r for r in cands if r not in base]
    for _ in range(k):
        best, best_cost = None, None
        for r in sorted(pool, key=lambda x: order_key[x]):
            s = sets[r]
            cost = (top_k * n_layers if s is None
                    else sum(len(set(s[layer].tolist()) - union[layer]) for layer in range(n_layers)))
            if best_cost is None or cost < best_cost:
                best, best_cost = r, cost
        if best is None:
            break
        chosen.append(best)
        pool.remove(best)
        if sets[best] is not None:
            for layer in range(n_layers):
                union[layer].update(sets[best][layer].tolist())
    return chosen


def test_greedy_and_union_cost_equal_their_python_twins():
    """The greedy pick and the union size in kernels against plain Python sets, on random sessions with unknown
    sets, mandatory ones, ties of cost and of order (small universes make equal costs common)."""
    from expertcache.events.rotation import _greedy, _union_cost

    rng = np.random.default_rng(7)
    for trial in range(400):
        L, N = int(rng.integers(1, 5)), int(rng.integers(2, 12))
        k = int(rng.integers(1, N + 1))
        n = int(rng.integers(1, 12))
        sessions = [int(x) for x in rng.permutation(40)[:n]]
        sets = {r: (None if rng.random() < 0.25 else np.stack([rng.choice(N, size=k, replace=False)
                                                               for _ in range(L)])) for r in sessions}
        keys = {r: (int(rng.integers(0, 3)), int(rng.integers(0, 3))) for r in sessions}   # ties of order too
        base = [r for r in sessions if rng.random() < 0.3]
        room = int(rng.integers(0, n + 2))
        got = _greedy(sessions, base, sets, room, L, keys, k)
        assert got == _greedy_twin(sessions, base, sets, room, L, keys, k), trial
        known = [sets[r] for r in got if sets[r] is not None]
        want = sum(len(set(np.concatenate([s[layer] for s in known]).tolist())) for layer in range(L)) if known else 0
        assert _union_cost(known, L) == want, trial
