"""Scoped experiments print their scope and agree with direct replays."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.events import build_events
from expertcache.experiment.scoped import service_disciplines, static_vs_dynamic
from expertcache.replay import ReplayConfig, replay
from expertcache.trace import select_requests
from expertcache.trace.examples import example_trace


def _halves():
    tr = select_requests(example_trace(), range(24))
    idx = np.arange(tr.n_requests)
    return select_requests(tr, idx[1::2]), select_requests(tr, idx[0::2])


def test_static_vs_dynamic_matches_direct_replays():
    ev, cal = _halves()
    rows, scope = static_vs_dynamic(ev, cal, batches=(2, 4), rho=0.4)
    assert scope["lossless"] is True and "frozen" in scope["static_fit"]
    s, c = build_events(ev, 4), build_events(cal, 4)
    assert rows[1].static == replay(s, ReplayConfig("static"), c).miss_fraction
    assert rows[1].belady <= min(rows[1].static, rows[1].lfru)
    assert rows[1].static_vs_lfru == (rows[1].lfru - rows[1].static) / rows[1].lfru


def test_service_disciplines_keep_the_request_set():
    ev, cal = _halves()
    rows, scope = service_disciplines(ev, cal, batch=4, admitted=8, window=2)
    assert [r.discipline.split()[0] for r in rows] == ["continuous", "rotation"]
    assert "W = 2" in scope["fairness"]
    assert all(1 <= r.mean_batch <= 4 for r in rows)


def test_experiment_commands(tmp_path):
    tr = select_requests(example_trace(), range(16))
    tr.save(tmp_path / "t")
    for args in (["static-vs-dynamic", "--batch", "2,4"], ["disciplines", "-B", "4", "-A", "8", "-W", "2"]):
        res = CliRunner().invoke(main, ["experiment", *args[:1], str(tmp_path / "t"), *args[1:], "--json"])
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        assert {"model", "rho", "concurrency", "discipline", "fairness", "lossless"} <= set(out["scope"])
        res = CliRunner().invoke(main, ["experiment", *args[:1], str(tmp_path / "t"), *args[1:]])
        assert res.exit_code == 0 and res.output.startswith("scope: ")


# ------------------------------------------------------------------ workload transition and partitioning
def _category_trace(groups, decode=6, L=1, N=8, k=2):
    """Hand-built trace: request i of category c routes every decode token to ``groups[c][i % len]`` at every layer."""
    from expertcache.trace import RoutingTrace

    reqs, cats, rows = [], {}, []
    for name, sets, n in groups:
        for i in range(n):
            rid = f"{name}-{i}"
            reqs.append(rid)
            cats[rid] = name
            rows += [sets[i % len(sets)]] * decode
    n_req = len(reqs)
    ex = np.array([[s] * L for s in rows], dtype=np.int16)
    return RoutingTrace(L, N, k, tuple(reqs), np.repeat(np.arange(n_req, dtype=np.int32), decode),
                        np.ones(n_req * decode, dtype=np.int8), np.tile(np.arange(decode, dtype=np.int32), n_req),
                        ex, None, np.full(n_req * decode, -1, dtype=np.int64), {"categories": cats})


def test_transition_warm_cache_hand_counts():
    from expertcache.experiment.scoped import warm_transition

    # A and B use the same experts {0,1}; C uses {4,5}. B=1, capacity 2 per layer (rho = 2/8).
    t = _category_trace([("A", [[0, 1]], 2), ("B", [[0, 1]], 2), ("C", [[4, 5]], 2)])
    units, scope = warm_transition(t, None, windows=(2,), rhos=(0.25,), seeds=(0,), batch=1, warm=2,
                                   pairs=[("A", "B"), ("C", "B")])
    ab, cb = units
    # warm-up = the 2 A requests x 6 steps; the B window = 12 events, all hits after A warmed {0,1}
    assert (ab.warmup_events, ab.counted_events) == (12, 12)
    assert ab.miss_fraction["lru"] == 0.0 and ab.miss_fraction["belady"] == 0.0
    # C warmed {4,5}: B's first event misses both experts, then hits: 2 transfers / 24 logical
    assert cb.miss_fraction["lru"] == cb.miss_fraction["belady"] == 2 / 24
    assert cb.cold == 2 / 24 and cb.gap == 0.0
    assert scope["units"] == 2 and scope["units_meeting"] == 0


@pytest.mark.parametrize("jobs", [2, 5])
def test_transition_in_threads_gives_the_units_of_one_thread(jobs, monkeypatch):
    """Units (and their cold replays) side by side in threads: the units of one thread, in its order; every
    replay in a worker thread."""
    import threading

    import expertcache.experiment.scoped as scoped
    from expertcache.trace.synth import SynthConfig, synthesize_trace

    t = synthesize_trace(SynthConfig(n_layers=3, n_experts=16, top_k=2, n_requests=18, decode_tokens=6,
                                     working_set=4, n_categories=3, seed=5))
    kw = dict(windows=(2, 3), rhos=(0.2, 0.4), seeds=(0, 1), batch=2)
    one, scope_one = scoped.warm_transition(t, None, **kw)
    where = set()
    plain = scoped.replay_curve

    def noted(*args, **kwargs):
        where.add(threading.current_thread() is threading.main_thread())
        return plain(*args, **kwargs)

    monkeypatch.setattr(scoped, "replay_curve", noted)
    many, scope_many = scoped.warm_transition(t, None, jobs=jobs, **kw)
    assert [u.to_dict() for u in many] == [u.to_dict() for u in one] and scope_many == scope_one
    assert len(one) == 6 * 2 * 2 * 2 and where == {False}


def test_transition_rejects_small_categories():
    from expertcache.errors import ValidationError
    from expertcache.experiment.scoped import warm_transition

    t = _category_trace([("A", [[0, 1]], 2), ("B", [[0, 1]], 2)])
    with pytest.raises(ValidationError, match="category 'B' has 2 requests; the transition needs 5"):
        warm_transition(t, None, windows=(5,), rhos=(0.25,), seeds=(0,), batch=1, warm=1)


def test_partition_equal_capacity_and_guard():
    from expertcache.experiment.scoped import category_partition

    # A uses {0,1}, B uses {2,3}: disjoint, so two partitions of 2 slots equal one shared cache of 4
    t = _category_trace([("A", [[0, 1]], 2), ("B", [[2, 3]], 2)])
    res, scope = category_partition(t, None, [["A"], ["B"]], [2], rho=0.5, batch=2, policy="lru")
    assert res.shared_capacity == 4 and res.slots == (2, 2)
    assert res.shared == res.measured == 4 / 48 and res.transfer_change == 0.0 and not res.warnings
    # one slot for A (< top-k 2): the guard fires, and A's partition thrashes: 6 A decode steps x 2 requests
    res, _ = category_partition(t, None, [["A"], ["*"]], [1], rho=0.5, batch=2, policy="lru")
    assert res.slots == (1, 3)
    assert any("1 slots per layer < top-k = 2" in w for w in res.warnings)
    # A (both A requests run together, B=2): 6 events {0,1} with 1 slot: 2 cold misses, then the retained
    # expert hits and the other misses (5 x 1); B: 2 cold misses in 3 slots
    assert res.measured == (2 + 5 + 2) / 48 and res.transfer_change > 0


def test_cli_transition_and_partition_print_scope(tmp_path):
    from expertcache.trace.synth import SynthConfig, synthesize_trace

    synthesize_trace(SynthConfig(n_layers=2, n_experts=16, top_k=2, n_requests=12, decode_tokens=8, working_set=4,
                                 n_categories=3, seed=3)).save(tmp_path / "t")
    r = CliRunner().invoke(main, ["experiment", "transition", str(tmp_path / "t"), "--windows", "2,4", "--rho",
                                  "0.25", "--seed", "0", "-B", "2"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("scope: model") and "units meet gap >= 10%" in r.output
    r2 = CliRunner().invoke(main, ["experiment", "transition", str(tmp_path / "t"), "--windows", "2,4", "--rho",
                                   "0.25", "--seed", "0", "-B", "2", "--jobs", "2"])
    assert r2.exit_code == 0 and r2.output == r.output
    r2 = CliRunner().invoke(main, ["experiment", "transition", str(tmp_path / "t"), "--jobs", "-1"])
    assert r2.exit_code == 2 and r2.output.strip() == "error: --jobs must be >= 0; got -1"
    r = CliRunner().invoke(main, ["experiment", "partition", str(tmp_path / "t"), "--groups",
                                  "category-0;*", "--slots", "1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["scope"]["concurrency"] == "B = 8" and out["result"]["warnings"]
    r = CliRunner().invoke(main, ["experiment", "partition", str(tmp_path / "t"), "--groups", "nope;*",
                                  "--slots", "1"])
    assert r.exit_code == 2 and "unknown categories ['nope']" in r.output


@pytest.mark.parametrize("name", ["transition", "partition", "static-vs-dynamic", "disciplines", "prefill-order",
                                  "prefill-gap"])
def test_every_experiment_runs_on_the_bundled_example_with_its_scope(name):
    """Issue 6: each scoped experiment runs on the bundled (recorded) example with defaults and prints D4 scope."""
    from importlib.resources import files

    trace_dir = str(files("expertcache") / "data" / "example_model_trace")
    r = CliRunner().invoke(main, ["experiment", name, trace_dir])
    assert r.exit_code == 0, r.output
    scope = r.output.splitlines()[0]
    assert scope.startswith("scope: model models/example-moe")
    for field in ("rho", "concurrency", "discipline", "fairness", "lossless True"):
        assert field in scope, field
