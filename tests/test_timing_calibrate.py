"""Calibration: the fit recovers hand-chosen costs from hand-made spans; `timing calibrate` on a tiny model."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.errors import ValidationError
from expertcache.events import EventStream
from expertcache.replay import ReplayConfig
from expertcache.timing import load_profile, simulate
from expertcache.timing.calibrate import CalibrationSpans, fit_nonnegative, fit_profile


def test_nonnegative_fit_recovers_exact_lines_and_ignores_an_outlier():
    x = np.arange(10.0)
    X = np.column_stack([np.ones(10), x])
    assert np.allclose(fit_nonnegative(X, 2.0 + 3.0 * x), [2.0, 3.0], rtol=1e-9)
    y = 2.0 + 3.0 * x
    y[4] += 1000.0            # one preempted sample: least absolute deviations stays on the other nine
    assert np.allclose(fit_nonnegative(X, y), [2.0, 3.0], rtol=1e-6)
    assert not np.allclose(fit_nonnegative(X, y, robust=False), [2.0, 3.0], rtol=1e-2)


def test_nonnegative_least_squares_against_a_naive_grid():
    """With robust=False the fit is non-negative least squares: no point of a fine grid of w >= 0 beats it."""
    rng = np.random.default_rng(3)
    X = np.column_stack([np.ones(30), rng.random(30), rng.random(30)])
    y = X @ [1.0, -0.5, 2.0] + rng.normal(0, 0.05, 30)     # the unconstrained optimum has a negative slope
    w = fit_nonnegative(X, y, robust=False)
    assert np.all(w >= 0) and w[1] == 0.0
    best = min(float(((X @ np.array(g) - y) ** 2).sum())
               for g in itertools.product(np.linspace(0, 3, 61), np.linspace(0, 1, 21), np.linspace(0, 3, 61)))
    assert float(((X @ w - y) ** 2).sum()) <= best + 1e-12


# hand-chosen costs of two MoE layers (seconds)
A, B_ = (1e-3, 8e-4), (2e-5, 3e-5)                       # dense fixed, per token
C0, C1, C2 = (3e-4, 2e-4), (1e-4, 1.2e-4), (4e-6, 5e-6)   # MoE block fixed, per member, per routed token
STEP0, STEP1 = 9e-4, 6e-5
LAT, BW, EXPERT = 2e-6, 20e9, 98_304
EXEC_LAT = 2.5e-5                                          # the executor's copy path per transfer


def _hand_spans(k: int = 4, n_experts: int = 32) -> CalibrationSpans:
    rng = np.random.default_rng(0)
    tokens = np.r_[rng.integers(1, 9, 60), rng.integers(10, 80, 12)]       # decode and prefill forwards
    layer = np.repeat([[0, 1]], tokens.shape[0], axis=0).reshape(-1)
    tok = np.repeat(tokens, 2)
    members = np.minimum(tok * k, rng.integers(k, n_experts + 1, tok.shape[0]))
    routed = tok * k
    decode = np.r_[np.ones(60, bool), np.zeros(12, bool)]
    ev_decode = np.repeat(decode, 2)
    # prefill forwards cost another line (their attention differs): the fit must follow the decode forwards
    dense = np.array(A)[layer] + np.array(B_)[layer] * tok + np.where(ev_decode, 0.0, 5e-4 + 1e-5 * tok)
    moe = np.array(C0)[layer] + np.array(C1)[layer] * members + np.array(C2)[layer] * routed
    step = STEP0 + STEP1 * tokens + np.where(decode, 0.0, 7e-4)
    copy_bytes = np.repeat([EXPERT, 4 * EXPERT], 20)
    return CalibrationSpans(layer, tok, members, routed, dense, moe, tokens, step, copy_bytes,
                            LAT + copy_bytes / BW, np.full(30, EXEC_LAT + EXPERT / BW), ev_decode, decode)


def test_fit_profile_recovers_hand_chosen_costs():
    p = fit_profile(_hand_spans(), n_layers=2, expert_bytes=EXPERT, name="hand", source="hand-made spans",
                    overlap=False)
    close = lambda a, b: np.allclose(a, b, rtol=1e-7, atol=1e-13)  # noqa: E731
    assert close(p.dense_fixed_s, np.add(A, C0)) and close(p.dense_per_token_s, B_)
    assert close(p.expert_fixed_s, C1) and close(p.expert_per_token_s, C2)
    assert close(p.step_fixed_s, STEP0) and close(p.step_per_token_s, STEP1)
    assert close(p.bandwidth, BW) and close(p.latency_s, EXEC_LAT)
    assert close(p.extra["fit"]["link"]["standalone_latency_s"], LAT)
    assert p.measured == "measured" and p.expert_bytes == EXPERT and p.overlap is False
    assert all(f["median_abs_rel"] < 1e-9 for f in p.extra["fit"]["dense"] + p.extra["fit"]["moe"])
    assert all(f["prefill"]["median_abs_rel"] > 0.05 for f in p.extra["fit"]["dense"])
    # without the phase flags one line through both phases misses the decode costs
    s = _hand_spans()
    blind = fit_profile(CalibrationSpans(*[getattr(s, f) for f in s.__dataclass_fields__][:11]), n_layers=2,
                        expert_bytes=EXPERT, name="x", source="y", overlap=False)
    assert not close(blind.step_fixed_s, STEP0) or not close(blind.step_per_token_s, STEP1)


def test_the_fitted_profile_reproduces_a_hand_timed_forward():
    """One decode forward of 3 tokens: step + per layer dense + MoE block with 5 resident members, by hand."""
    p = fit_profile(_hand_spans(), n_layers=2, expert_bytes=EXPERT, name="hand", source="s", overlap=False)
    stream = EventStream.from_lists(2, 32, 4, steps=[0, 0], layers=[0, 1], experts=[[0, 1, 2, 3, 4]] * 2,
                                    active=[3, 3], multiplicity=[[3, 3, 2, 2, 2]] * 2)
    r = simulate(stream, ReplayConfig("lru", capacity=(32, 32), warmup_events=0), p)
    want = STEP0 + 3 * STEP1 + sum(A[l] + B_[l] * 3 + C0[l] + 5 * C1[l] + 12 * C2[l] for l in (0, 1))
    # every member misses once (cold cache): five blocking transfers per layer
    want += 10 * (EXEC_LAT + EXPERT / BW)
    assert r.time_s == pytest.approx(want, rel=1e-7)


def test_bad_spans_are_refused():
    s = _hand_spans()
    with pytest.raises(ValidationError, match="one length"):
        CalibrationSpans(*[getattr(s, f) for f in s.__dataclass_fields__][:5], s.event_moe_s[:-1],
                         *[getattr(s, f) for f in s.__dataclass_fields__][6:11])
    with pytest.raises(ValidationError, match="finite"):
        CalibrationSpans(*[getattr(s, f) for f in s.__dataclass_fields__][:10], np.array([np.nan]))
    with pytest.raises(ValidationError, match="layer 2"):
        fit_profile(s, n_layers=3, expert_bytes=EXPERT, name="x", source="y", overlap=False)
    one = CalibrationSpans(*[getattr(s, f) for f in s.__dataclass_fields__][:8], s.copy_bytes[:5], s.copy_s[:5],
                           s.transfer_s)
    with pytest.raises(ValidationError, match="one entry per"):
        CalibrationSpans(*[getattr(s, f) for f in s.__dataclass_fields__][:11], s.event_decode[:-1])
    with pytest.raises(ValidationError, match="two sizes"):
        fit_profile(one, n_layers=2, expert_bytes=EXPERT, name="x", source="y", overlap=False)
    both = CalibrationSpans.concat([s, one])
    assert both.event_layer.shape[0] == 2 * s.event_layer.shape[0] and both.event_decode.sum() == 120 + 144  # flags of `one` default to decode


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from expertcache.execute.tiny import save_model_dir, write_prompts

    d = tmp_path_factory.mktemp("calib")
    return save_model_dir("qwen3_moe", d / "model"), write_prompts(d / "prompts.jsonl")


def test_calibrate_writes_a_valid_measured_profile(tiny_model, tmp_path):
    import torch

    model, prompts = tiny_model
    out = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["timing", "calibrate", str(model), "--prompts", str(prompts), "-o", str(out),
                                    "--no-chat-template", "--max-new-tokens", "4", "--batch", "1,3",
                                    "--copy-repeats", "5", "--threads", "1", "--json"])
    assert res.exit_code == 0, res.output
    p = load_profile(out)
    printed = json.loads(res.output)
    assert {k: v for k, v in printed.items() if not k.endswith("_version")} == json.loads(json.dumps(p.to_dict()))
    assert p.measured == "measured" and p.overlap is False and p.expert_bytes == 2 * 16 * 32 * 4 + 32 * 16 * 4
    assert torch.__version__ in p.source and "device cpu" in p.source and "model model" in p.source
    for name in ("dense_fixed_s", "dense_per_token_s", "expert_fixed_s", "expert_per_token_s"):
        values = np.asarray(getattr(p, name))
        assert values.shape == (3,) and np.all(np.isfinite(values)) and np.all(values >= 0), name
    # the per-event fixed cost is real work (Python and kernel launches): strictly positive in every layer (on a
    # run this short the per-expert and per-event parts may trade places, so only their sum is asserted)
    assert np.all(np.asarray(p.dense_fixed_s) + 4 * np.asarray(p.expert_fixed_s) > 0)
    assert p.step_fixed_s > 0 and p.latency_s > 0 and 0 < p.bandwidth < 1e13
    fit = p.extra["fit"]
    assert [f["layer"] for f in fit["moe"]] == [0, 1, 2] and fit["step"]["n"] > 0
    assert fit["link"]["executor_transfers"] > 0 and p.extra["batches"] == [1, 3]
    # the profile times a stream of this model (three layers, 16 experts)
    stream = EventStream.from_lists(3, 16, 4, steps=[0, 0, 0], layers=[0, 1, 2], experts=[[0, 1, 2, 3]] * 3,
                                    active=[1] * 3)
    assert simulate(stream, ReplayConfig("lru", rho=1.0), p).time_s > 0


def test_cli_errors_are_one_line_and_exit_2(tiny_model, tmp_path):
    model, prompts = tiny_model
    runner = CliRunner()
    out = tmp_path / "p.json"
    cases = [
        ["timing", "calibrate", str(tmp_path / "missing"), "-o", str(out)],
        ["timing", "calibrate", str(model), "--prompts", str(prompts), "-o", str(out), "--device", "bogus"],
        ["timing", "calibrate", str(model), "--prompts", str(prompts), "-o", str(out), "--device", "cuda:7"],
        ["timing", "calibrate", str(tmp_path), "--prompts", str(prompts), "-o", str(out)],
        ["timing", "calibrate", str(model), "--prompts", str(tmp_path / "none.jsonl"), "-o", str(out)],
        ["timing", "calibrate", str(model), "--prompts", str(prompts), "-o", str(out), "--batch", "0"],
        ["timing", "calibrate", str(model), "--prompts", str(prompts), "-o", str(out), "--clock", "sundial"],
    ]
    for args in cases:
        res = runner.invoke(main, args)
        assert res.exit_code == 2, (args, res.output)
        assert len(res.output.strip().splitlines()) <= 3 and "Traceback" not in res.output, res.output
        assert not out.exists()
    mine = tmp_path / "mine.json"
    mine.write_text("the user's file")
    res = runner.invoke(main, ["timing", "calibrate", str(model), "--prompts", str(prompts), "-o", str(mine)])
    assert res.exit_code == 2 and mine.read_text() == "the user's file"



def test_the_cpu_clock_leaves_out_time_the_thread_did_not_run():
    pytest.importorskip("torch")
    import time

    from expertcache.execute.timings import SpanTimer

    spans = {}
    for clock in ("wall", "cpu"):
        timer = SpanTimer("cpu", clock)
        token = timer.begin()
        time.sleep(0.05)                       # the thread is off the CPU
        timer.end(token, "forward", 0, 1)
        spans[clock] = int(timer.columns()["ns"][0])
    assert spans["wall"] >= 50_000_000 > 5 * spans["cpu"]
    with pytest.raises(ValueError, match="clock"):
        SpanTimer("cpu", "sundial")
