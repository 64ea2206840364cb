"""The demo reproduces the qualitative finding of §4.3 on both bundled examples (recorded model routing, synthetic)."""

from __future__ import annotations

import pytest

from expertcache.report.demo import run_demo


@pytest.fixture(scope="module", params=["model", "synthetic"])
def report(request):
    return run_demo(batch=8, rho=0.4, seed=0, example=request.param)


def test_regime_is_skewed_and_concurrent(report):
    assert report.batch > 1
    assert report.stream.union < report.stream.logical          # concurrency deduplicates
    assert report.mean_ratio > 0.8                                # near or past the quota boundary (§6.1)


def test_sequential_inflates_lru_far_more_than_frequency_offline_and_static(report):
    rows = {r.policy: r for r in report.rows}
    lru = rows["lru"].inflation("sequential-ascending")
    assert lru > 0.2
    for other in ("lfu", "belady"):
        assert rows[other].inflation("sequential-ascending") < lru / 4, other
    assert rows["static-same-trace"].inflation("sequential-ascending") == 0.0
    assert rows["static-same-trace"].inflation("sequential-random") == 0.0
    assert rows["static"].inflation("sequential-ascending") == 0.0


def test_ascending_order_inflates_more_than_random_order(report):
    rows = {r.policy: r for r in report.rows}
    assert rows["lru"].inflation("sequential-ascending") > rows["lru"].inflation("sequential-random") > 0


def test_least_stale_equals_lru_and_demand_equals_union(report):
    rows = {r.policy: r for r in report.rows}
    for sem in ("event-atomic", "sequential-ascending", "sequential-random"):
        assert rows["least-stale"].results[sem].transferred == rows["lru"].results[sem].transferred
        assert rows["demand"].results[sem].transferred == report.stream.union


def test_ranking_inverts_between_semantics(report):
    """Sequential replay makes the same-trace static diagnostic beat LRU by more than event-atomic replay does."""
    rows = {r.policy: r for r in report.rows}
    gap_seq = rows["lru"].miss("sequential-ascending") - rows["static-same-trace"].miss("sequential-ascending")
    gap_ea = rows["lru"].miss("event-atomic") - rows["static-same-trace"].miss("event-atomic")
    assert gap_seq > 2 * gap_ea


def _seen(count):
    from contextlib import contextmanager

    @contextmanager
    def fake():
        class Seen:
            pass

        seen = Seen()
        seen.count = count
        yield seen

    return fake


def test_a_first_run_spreads_the_replays_over_processes_with_the_same_results(monkeypatch):
    """Where kernels compiled (a first run), the demo's replays run in worker processes (``sweep``); the report is
    the one the replays give one after another; where nothing compiled, no worker is started."""
    from expertcache.report import demo as D

    serial = D.run_demo(jobs=1)
    real, calls = D.sweep, []

    def spy(*a, **k):
        calls.append(k["jobs"])
        return real(*a, **k)

    monkeypatch.setattr(D, "sweep", spy)
    monkeypatch.setattr(D, "counting_compiles", _seen(1))
    spread = D.run_demo(jobs=2)
    assert calls == [2]
    assert [(r.policy, r.results) for r in spread.rows] == [(r.policy, r.results) for r in serial.rows]
    monkeypatch.setattr(D, "counting_compiles", _seen(0))
    assert [(r.policy, r.results) for r in D.run_demo(jobs=2).rows] == [(r.policy, r.results) for r in serial.rows]
    assert calls == [2]                                   # a warm run: no workers


def test_the_demo_runs_on_where_no_worker_process_can_start(monkeypatch):
    from concurrent.futures.process import BrokenProcessPool

    from expertcache.report import demo as D

    def broken(*a, **k):
        raise BrokenProcessPool("no processes here")

    monkeypatch.setattr(D, "sweep", broken)
    monkeypatch.setattr(D, "counting_compiles", _seen(1))
    got = D.run_demo(jobs=2)
    assert [(r.policy, r.results) for r in got.rows] == [(r.policy, r.results) for r in D.run_demo(jobs=1).rows]
