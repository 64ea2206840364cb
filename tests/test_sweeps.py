"""Sweeps: rho ranges, parallel workers identical to serial, curves in the CLI and as a figure."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from test_twin_large import random_stream

from expertcache.cli import main
from expertcache.replay import ReplayConfig, replay, sweep


@pytest.fixture(scope="module")
def stream_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sw") / "stream"
    random_stream(4, N=48, steps=25).save(out)
    return out


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_sweep_parallel_equals_serial_equals_single_replays():
    s = random_stream(3, N=48, steps=20)
    cfgs = [ReplayConfig(p, rho=r, semantics=sem, seed=2)
            for p in ("lru", "lfru", "belady-forced") for sem in ("event-atomic", "sequential-random")
            for r in (0.1, 0.45, 0.8)]
    cfgs.append(ReplayConfig("lru", capacity=(3, 4, 5)))
    serial = sweep(s, cfgs, jobs=1)
    assert serial == sweep(s, cfgs, jobs=2)
    assert serial == [replay(s, c) for c in cfgs]


def test_rho_range_syntax_gives_nineteen_points(stream_dir):
    res = invoke("replay", stream_dir, "--policy", "lru", "--rho", "0.05:0.95:0.05", "--json")
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in res.output.splitlines()]
    assert [r["rho"] for r in rows] == [round(0.05 * i, 10) for i in range(1, 20)]
    assert all(a["transferred"] >= b["transferred"] for a, b in zip(rows, rows[1:], strict=False))


def test_jobs_do_not_change_the_output(stream_dir):
    args = ("replay", stream_dir, "--policy", "lru,lfu,belady", "--rho", "0.2,0.4", "--semantics",
            "event-atomic,sequential-ascending", "--json")
    one = invoke(*args, "--jobs", "1")
    two = invoke(*args, "--jobs", "2")
    assert one.exit_code == two.exit_code == 0
    assert one.output == two.output


def test_plot_writes_a_figure(stream_dir, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "curve.png"
    res = invoke("replay", stream_dir, "--policy", "lru,belady", "--rho", "0.1:0.9:0.2", "--plot", out)
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    (("--rho", "0.5:0.1:0.1"), "START:STOP:STEP"),
    (("--rho", "0.1:0.9:x"), "START:STOP:STEP"),
    (("--rho", "0.1:1.5:0.5"), "rho must be a number in [0, 1]"),
    (("--plot", "curve.jpg"), "must end in .png, .pdf or .svg"),
    (("--jobs", "-1"), "--jobs must be >= 0"),
])
def test_bad_sweep_arguments(stream_dir, args, message):
    res = invoke("replay", stream_dir, *args)
    assert res.exit_code == 2
    assert message in res.output
    assert "Traceback" not in res.output
