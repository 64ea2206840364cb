"""Scoped experiments print their scope and agree with direct replays."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.demo import example_trace
from expertcache.events import build_events
from expertcache.experiments import service_disciplines, static_vs_dynamic
from expertcache.replay import ReplayConfig, replay
from expertcache.trace import select_requests


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
    for args in (["static-vs-dynamic", "--batches", "2,4"], ["disciplines", "-B", "4", "-A", "8", "-W", "2"]):
        res = CliRunner().invoke(main, ["experiment", *args[:1], str(tmp_path / "t"), *args[1:], "--json"])
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        assert {"model", "rho", "concurrency", "discipline", "fairness", "lossless"} <= set(out["scope"])
        res = CliRunner().invoke(main, ["experiment", *args[:1], str(tmp_path / "t"), *args[1:]])
        assert res.exit_code == 0 and res.output.startswith("scope: ")
