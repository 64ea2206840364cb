"""Arrival processes: requests arriving by a Poisson process or at the steps a file gives, under FCFS admission."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.errors import ValidationError
from expertcache.events import ArrivalOffsets, build_events, fcfs_schedule
from expertcache.events.fcfs import decode_rows
from expertcache.trace import select_requests
from expertcache.trace.examples import example_model_trace


def naive_fcfs(lengths, arrivals, batch):
    """Step by step: admit arrived requests in (arrival, input order) while slots are free; each runs a token."""
    waiting = sorted((int(a), i) for i, a in enumerate(arrivals) if lengths[i] > 0)
    running, done, out, s = [], {}, set(), 0
    while waiting or running:
        while len(running) < batch and waiting and waiting[0][0] <= s:
            running.append(waiting.pop(0)[1])
        for r in running:
            out.add((s, r, done.get(r, 0)))
            done[r] = done.get(r, 0) + 1
        running = [r for r in running if done[r] < lengths[r]]
        s += 1
    return out


def _schedule(lengths, arrivals, batch):
    step, req, tok = fcfs_schedule(np.asarray(lengths), np.asarray(arrivals), batch)
    return set(zip(step.tolist(), req.tolist(), tok.tolist(), strict=True))


def test_hand_built_schedule_from_a_keyed_file(tmp_path):
    """Lengths 2, 3, 1; r0 and r1 arrive at 0, r2 at 1. B = 2: steps 0-1 serve r0, r1; r0 leaves after step 1;
    step 2 serves r1 (its third token) and r2 (arrived at 1, waiting for a slot)."""
    (tmp_path / "a.csv").write_text("request_id,arrival_step\nr2,1\nr0,0\nr1,0\n")
    offs = ArrivalOffsets.parse(f"file:{tmp_path / 'a.csv'}")
    arrivals = offs.arrivals(3, ["r0", "r1", "r2"])
    assert arrivals.tolist() == [0, 0, 1]
    want = {(0, 0, 0), (0, 1, 0), (1, 0, 1), (1, 1, 1), (2, 1, 2), (2, 2, 0)}
    assert _schedule([2, 3, 1], arrivals, 2) == want == naive_fcfs([2, 3, 1], arrivals, 2)
    # B = 1: one at a time in arrival order, r2 last
    assert _schedule([2, 3, 1], arrivals, 1) == {(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1), (4, 1, 2), (5, 2, 0)}


def test_a_late_arrival_leaves_an_idle_gap():
    arrivals = np.array([0, 10])
    assert _schedule([2, 2], arrivals, 4) == {(0, 0, 0), (1, 0, 1), (10, 1, 0), (11, 1, 1)}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_poisson_arrivals_schedule_like_the_naive_loop(seed, batch):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 9, size=25)
    arrivals = ArrivalOffsets.parse("poisson:0.3", seed=seed).arrivals(25)
    assert np.all(np.diff(arrivals) >= 0)
    assert _schedule(lengths, arrivals, batch) == naive_fcfs(lengths, arrivals, batch)


def test_poisson_is_seeded_and_has_the_stated_rate():
    a = ArrivalOffsets.parse("poisson:0.25", seed=7).arrivals(40_000)
    assert np.array_equal(a, ArrivalOffsets.parse("poisson:0.25", seed=7).arrivals(40_000))
    assert not np.array_equal(a, ArrivalOffsets.parse("poisson:0.25", seed=8).arrivals(40_000))
    assert abs(a[-1] / 40_000 - 4.0) < 0.1          # mean gap 1 / rate = 4 steps
    counts = np.bincount(a)                          # arrivals per step: Poisson(0.25), variance = mean
    assert abs(counts.mean() - 0.25) < 0.01 and abs(counts.var() - 0.25) < 0.02


def test_positional_file_equals_keyed_and_a_bom_is_accepted(tmp_path):
    tr = select_requests(example_model_trace(), range(6))
    steps = [0, 3, 3, 9, 1, 4]
    (tmp_path / "pos.csv").write_bytes(("\ufeffarrival_step\n" + "\n".join(map(str, steps)) + "\n").encode())
    (tmp_path / "key.csv").write_text("request_id,arrival_step\n" + "".join(
        f"{r},{s}\n" for r, s in reversed(list(zip(tr.request_ids, steps, strict=True)))))
    a = build_events(tr, 2, ArrivalOffsets.parse(f"file:{tmp_path / 'pos.csv'}"))
    b = build_events(tr, 2, ArrivalOffsets.parse(f"file:{tmp_path / 'key.csv'}"))
    for name in ("step", "layer", "offsets", "expert"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    lengths, _ = decode_rows(tr)
    want = naive_fcfs(lengths, np.array(steps), 2)
    assert sorted({s for s, _, _ in want}) == sorted(set(a.step.tolist()))


@pytest.mark.parametrize("text, match", [
    ("request_id,arrival_step\nr0,-1\n", "integer in"),
    ("request_id,arrival_step\nr0,x\n", "integer in"),
    ("request_id,arrival_step\nr0,99999999999999999\n", "integer in"),
    ("request_id,arrival_step\nr0,1\nr0,2\n", "more than one"),
    ("request_id,arrival_step\nr0\n", "expected request_id,arrival_step"),
    ("arrival_step\n", "no arrival steps"),
    ("", "no arrival steps"),
    ("1\n2,3\n", "one arrival step"),
    (b"\xff\xfe\x00bad", "not a readable CSV"),
])
def test_bad_arrival_files_are_one_line(tmp_path, text, match):
    f = tmp_path / "a.csv"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValidationError, match=match) as err:
        ArrivalOffsets.parse(f"file:{f}").arrivals(1, ["r0"])
    assert str(f) in str(err.value) and "\n" not in str(err.value)


def test_files_must_cover_the_trace(tmp_path):
    (tmp_path / "k.csv").write_text("request_id,arrival_step\nr0,1\n")
    (tmp_path / "p.csv").write_text("1\n2\n")
    with pytest.raises(ValidationError, match="no arrival step for request 'r1'"):
        ArrivalOffsets.parse(f"file:{tmp_path / 'k.csv'}").arrivals(2, ["r0", "r1"])
    with pytest.raises(ValidationError, match="lists 2 arrival steps; the trace has 3"):
        ArrivalOffsets.parse(f"file:{tmp_path / 'p.csv'}").arrivals(3)
    with pytest.raises(ValidationError, match="no such arrivals file"):
        ArrivalOffsets.parse(f"file:{tmp_path / 'missing.csv'}")
    for bad in ("poisson:0", "poisson:-1", "poisson:nan", "poisson:x", "poisson:1:2"):
        with pytest.raises(ValidationError):
            ArrivalOffsets.parse(bad)


def test_cli_builds_streams_under_both_processes(tmp_path):
    runner = CliRunner()
    trace = str(tmp_path / "t")
    select_requests(example_model_trace(), range(8)).save(trace)
    res = runner.invoke(main, ["events", "build", trace, "-B", "2", "--offsets", "poisson:0.2", "--seed", "3",
                               "-o", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    prov = json.loads((tmp_path / "s" / "manifest.json").read_text())["provenance"]
    assert prov["offsets"] == "poisson:0.2" and prov["offsets_seed"] == 3
    (tmp_path / "a.csv").write_text("\n".join(str(i * 5) for i in range(8)) + "\n")
    res = runner.invoke(main, ["events", "build", trace, "-B", "2", "--offsets", f"file:{tmp_path / 'a.csv'}",
                               "-o", str(tmp_path / "f")])
    assert res.exit_code == 0, res.output
    bad = runner.invoke(main, ["events", "build", trace, "-B", "2", "--offsets", "poisson:0", "-o",
                               str(tmp_path / "g")])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1 and not (tmp_path / "g").exists()
