"""Cross-model alignment by r̄ (Table 11 shape) on two synthetic models of different expert counts."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from expertcache.analysis import align, reference_frame_r_null, regime_grid
from expertcache.cli import main
from expertcache.trace.synth import SynthConfig, synthesize_trace


@pytest.fixture(scope="module")
def traces():
    small = synthesize_trace(SynthConfig(n_layers=2, n_experts=16, top_k=4, n_requests=8, decode_tokens=24,
                                         working_set=6, seed=1))
    large = synthesize_trace(SynthConfig(n_layers=2, n_experts=64, top_k=4, n_requests=8, decode_tokens=24,
                                         working_set=8, seed=2))
    return {"16-expert": small, "64-expert": large}


def test_batch_alignment_and_r_bar_alignment(traces):
    grid = regime_grid(traces, [1, 2, 4, 8], rho=0.4)
    assert len(grid) == 8
    for m in traces:                                   # r̄ grows with concurrency
        rs = [p.r_mean for p in grid if p.model == m]
        assert rs == sorted(rs)
    rows = align(grid, batch=4, tolerance=0.2)
    by_b = [r for r in rows if r.alignment == "batch size"]
    assert {r.model for r in by_b} == set(traces) and all(r.batch == 4 for r in by_b)
    groups = {}
    for r in rows:
        if r.alignment == "r_bar":
            groups.setdefault(r.target, []).append(r)
    assert groups, "some conditions of the two models share a regime"
    for target, g in groups.items():
        assert len({r.model for r in g}) == len(g) >= 2
        assert all(abs(r.r_mean - target) <= 0.2 * target for r in g)
        gaps = [r.gap for r in g]
        assert g[-1].spread_pp == pytest.approx((max(gaps) - min(gaps)) * 100)


def test_reference_frame_projection_matches_the_paper():
    assert reference_frame_r_null(8) == pytest.approx(0.335, abs=0.002)   # §6.4: "r_bar ~= 0.335"


def test_align_command(traces, tmp_path):
    args = []
    for name, tr in traces.items():
        tr.save(tmp_path / name)
        args.append(f"{name}={tmp_path / name}")
    res = CliRunner().invoke(main, ["align", *args, "--sweep-batch", "1,2,4", "--batch", "2", "--json"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in res.output.splitlines()]
    assert {r["alignment"] for r in rows} >= {"batch size"}
    res = CliRunner().invoke(main, ["align", args[0]])
    assert res.exit_code == 2 and "at least two traces" in res.output
