"""Experiment specs: expansion, resumable runs (interrupted and really killed), re-runs of exactly the
changed conditions, Ray equal to local, and results equal to direct replays."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from expertcache.analysis import gap_decomposition
from expertcache.cli import main
from expertcache.events import ArrivalOffsets, build_events
from expertcache.events.rotation import RotationConfig, rotation_events
from expertcache.experiment import (
    ResultStore,
    expand,
    read_results,
    run_spec,
    spec_from_dict,
    summarize,
)
from expertcache.experiment.spec import load_spec
from expertcache.replay import ReplayConfig, replay
from expertcache.trace import read_trace, select_requests
from expertcache.trace.synth import SynthConfig, synthesize_trace

POLICIES = ["lru", "lfu", "lfru", "least-stale", "belady"]


def tiny(seed: int, n_requests: int = 12):
    return synthesize_trace(SynthConfig(n_layers=2, n_experts=8, top_k=2, n_requests=n_requests, decode_tokens=6,
                                        working_set=4, seed=seed))


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("traces")
    tiny(1).save(root / "a")
    tiny(2).save(root / "b")
    return root


def thousand(root: Path) -> dict:
    """1,000 conditions: 5 selections x 2 batches x 5 policies x 4 rho x 5 tie seeds."""
    return {"experiment": {"name": "thousand"}, "inputs": {"a": {"trace": "a"}},
            "selections": {"first6": {"range": [0, 6]}, "last6": {"range": [6, 12]},
                           "s8": {"sample": 8, "seed": 1}, "mix": {"concat": ["last6:3", "first6"]}},
            "grid": {"input": "a", "selection": ["all", "first6", "last6", "s8", "mix"], "batch": [2, 4],
                     "policy": POLICIES, "rho": [0.2, 0.4, 0.6, 0.8], "tie_seed": [0, 1, 2, 3, 4]}}


THOUSAND_TOML = """
[experiment]
name = "thousand"
[inputs.a]
trace = "a"
[selections.first6]
range = [0, 6]
[selections.last6]
range = [6, 12]
[selections.s8]
sample = 8
seed = 1
[selections.mix]
concat = ["last6:3", "first6"]
[grid]
input = "a"
selection = ["all", "first6", "last6", "s8", "mix"]
batch = [2, 4]
policy = ["lru", "lfu", "lfru", "least-stale", "belady"]
rho = [0.2, 0.4, 0.6, 0.8]
tie_seed = [0, 1, 2, 3, 4]
"""


@pytest.fixture(scope="module")
def reference(traces, tmp_path_factory):
    """The uninterrupted run of the 1,000-condition spec: (store path, table)."""
    store = tmp_path_factory.mktemp("ref") / "store"
    report = run_spec(spec_from_dict(thousand(traces), traces), store, jobs=1)
    assert report.n_conditions == 1000 and len(report.ran) == 1000 and report.n_skipped == 0
    return store, pq.read_table(store / "results.parquet")


# ----------------------------------------------------------------------------- expansion
def test_toml_and_dict_expand_to_the_same_conditions_with_stable_ids(traces):
    (traces / "thousand.toml").write_text(THOUSAND_TOML)
    from_toml = expand(load_spec(traces / "thousand.toml"))
    from_dict = expand(spec_from_dict(thousand(traces), traces))
    assert len(from_toml) == 1000
    assert [(p.condition_id, p.condition_hash) for p in from_toml] == \
           [(p.condition_id, p.condition_hash) for p in from_dict]
    assert len({p.condition_id for p in from_toml}) == 1000
    # axis order in the grid does not change IDs
    d = thousand(traces)
    d["grid"]["rho"] = list(reversed(d["grid"]["rho"]))
    assert {p.condition_id for p in expand(spec_from_dict(d, traces))} == {p.condition_id for p in from_dict}


def test_axes_that_do_not_apply_collapse(traces):
    d = {"inputs": {"a": {"trace": "a"}},
         "grid": {"input": "a", "batch": 2, "offsets": ["zero", "stagger:1"], "offsets_seed": [0, 1, 2],
                  "admitted": [4, 6], "policy": "lru", "rho": 0.4}}
    planned = expand(spec_from_dict(d, traces))
    # fcfs ignores admitted; zero and stagger offsets ignore the seed: 2 conditions, not 12
    assert len(planned) == 2
    assert all(p.condition.admitted is None and p.condition.offsets_seed is None for p in planned)


@pytest.mark.parametrize("patch, message", [
    ({"grid": {"input": "zzz", "batch": 2, "policy": "lru", "rho": 0.4}}, "unknown input 'zzz'"),
    ({"grid": {"input": "a", "batch": 2, "policy": "lru", "rho": 0.4, "rhoo": 1}}, "unknown grid axis"),
    ({"grid": {"input": "a", "batch": 0, "policy": "lru", "rho": 0.4}}, "batch must be a positive integer"),
    ({"grid": {"input": "a", "batch": 2, "policy": "lruu", "rho": 0.4}}, "unknown policy 'lruu'"),
    ({"grid": {"input": "a", "batch": 2, "policy": "static", "rho": 0.4}}, "needs calibration"),
    ({"grid": {"input": "a", "batch": 2, "policy": "lru", "rho": 1.5}}, "rho must be a number in [0, 1]"),
    ({"grid": {"input": "a", "batch": 2, "policy": "lru", "rho": 0.4, "selection": "nope"}}, "unknown selection"),
    ({"selections": {"x": {"range": [3, 1]}}}, "range must be [start, stop)"),
    ({"selections": {"x": {"concat": ["x"]}}}, "refers to itself"),
    ({"selections": {"x": {"range": [0, 40]}},
      "grid": {"input": "a", "batch": 2, "policy": "lru", "rho": 0.4, "selection": "x"}},
     "range [0, 40) exceeds the trace's 12 requests"),
    ({"selections": {"x": {"concat": ["all", "all:13"]}},
      "grid": {"input": "a", "batch": 2, "policy": "lru", "rho": 0.4, "selection": "x"}},
     "asks for the first 13 requests of 'all', which holds 12"),
])
def test_bad_specs_are_refused_with_a_clear_message(traces, patch, message):
    d = {"inputs": {"a": {"trace": "a"}}, "grid": {"input": "a", "batch": 2, "policy": "lru", "rho": 0.4}}
    d.update(patch)
    with pytest.raises(ValueError, match=re.escape(message)):
        expand(spec_from_dict(d, traces))


# ----------------------------------------------------------------------------- results are right
def _fields(table, cid):
    rows = [i for i, c in enumerate(table["condition_id"].to_pylist()) if c == cid]
    rec = {k: table[k][rows[0]].as_py() for k in ("selection", "batch", "policy", "rho", "tie_seed")}
    rec.update({table["metric"][i].as_py(): table["value"][i].as_py() for i in rows})
    return rec


def test_stored_results_equal_direct_replays(traces, reference):
    _, table = reference
    tr = read_trace(traces / "a")
    rng = np.random.default_rng(0)
    ids = sorted(set(table["condition_id"].to_pylist()))
    sel_idx = {"all": list(range(12)), "first6": list(range(6)), "last6": list(range(6, 12)),
               "s8": sorted(np.random.default_rng(1).choice(12, 8, replace=False).tolist()),
               "mix": [6, 7, 8, 0, 1, 2, 3, 4, 5]}
    for cid in rng.choice(ids, 25, replace=False):
        f = _fields(table, cid)
        stream = build_events(select_requests(tr, sel_idx[f["selection"]]), f["batch"])
        r = replay(stream, ReplayConfig(f["policy"], rho=f["rho"], seed=f["tie_seed"]))
        assert (f["transferred"], f["hits"], f["logical"], f["union"]) == (r.transferred, r.hits, r.logical, r.union)
        assert f["miss_fraction"] == r.miss_fraction


def test_summary_gap_equals_gap_decomposition_per_seed(traces, reference):
    store, table = reference
    summ = summarize(read_results(store), "gap", rows=("selection", "batch"), cols=("rho",),
                     where={"selection": "first6", "batch": 4, "rho": 0.4})
    (cell,) = summ.cells
    stream = build_events(select_requests(read_trace(traces / "a"), range(6)), 4)
    ref = gap_decomposition(stream, rho=0.4, seeds=(0, 1, 2, 3, 4))
    assert cell.n == 5
    assert cell.min == pytest.approx(min(ref.gap_per_seed), abs=1e-15)
    assert cell.max == pytest.approx(max(ref.gap_per_seed), abs=1e-15)
    assert cell.mean == pytest.approx(sum(ref.gap_per_seed) / 5, abs=1e-15)


def test_rotation_and_random_offsets_and_order_seed_match_direct_builds(traces, tmp_path):
    d = {"inputs": {"a": {"trace": "a"}},
         "grid": [{"input": "a", "discipline": "rotation", "batch": 2, "admitted": 4, "window": 3,
                   "scheduler": ["fcfs_deadline", "causal_prev_route"], "policy": "lfru", "rho": 0.4},
                  {"input": "a", "batch": 3, "offsets": "random:0:5", "offsets_seed": 7, "order_seed": 3,
                   "policy": "lru", "rho": 0.3}]}
    run_spec(spec_from_dict(d, traces), tmp_path / "s", jobs=1)
    table = read_results(tmp_path / "s")
    recs = {}
    for i, cid in enumerate(table["condition_id"].to_pylist()):
        recs.setdefault(cid, {"scheduler": table["scheduler"][i].as_py()})[table["metric"][i].as_py()] = \
            table["value"][i].as_py()
    tr = read_trace(traces / "a")
    got = sorted((r.get("scheduler") or "", r["transferred"], r.get("max_interval")) for r in recs.values())
    want = []
    for sched in ("fcfs_deadline", "causal_prev_route"):
        s, stats = rotation_events(tr, RotationConfig(4, 2, 3, sched))
        want.append((sched, float(replay(s, ReplayConfig("lfru", rho=0.4)).transferred), float(stats.max_interval)))
    order = np.random.default_rng([3, 0]).permutation(12)
    s = build_events(select_requests(tr, order), 3, ArrivalOffsets("random", low=0, high=5, seed=7))
    want.append(("", float(replay(s, ReplayConfig("lru", rho=0.3)).transferred), None))
    assert got == sorted(want)


def test_stream_inputs_and_static_calibration_match_direct_replays(traces, tmp_path):
    tr_a, tr_b = read_trace(traces / "a"), read_trace(traces / "b")
    build_events(tr_a, 2).save(tmp_path / "stream_a")
    build_events(tr_b, 2).save(tmp_path / "cal_stream")
    d = {"inputs": {"s": {"stream": "stream_a", "calibration": "cal_stream"},
                    "t": {"trace": str(traces / "a"), "calibration": str(traces / "b")}},
         "grid": {"input": ["s", "t"], "batch": [2, 4], "policy": ["static", "lfu"], "rho": [0.25, 0.5]}}
    planned = expand(spec_from_dict(d, tmp_path))
    assert len(planned) == 4 + 8                       # a stream ignores batch: 2 policies x 2 rho
    run_spec(spec_from_dict(d, tmp_path), tmp_path / "store", jobs=1)
    table = read_results(tmp_path / "store")
    got = {}
    for i, m in enumerate(table["metric"].to_pylist()):
        if m == "transferred":
            key = tuple(table[k][i].as_py() for k in ("input", "batch", "policy", "rho"))
            got[key] = table["value"][i].as_py()
    want = {}
    for inp, b in (("s", None), ("t", 2), ("t", 4)):
        stream = build_events(tr_a, b or 2)
        cal = build_events(tr_b, b or 2)
        for policy in ("static", "lfu"):
            for rho in (0.25, 0.5):
                want[(inp, b, policy, rho)] = float(replay(stream, ReplayConfig(policy, rho=rho), cal).transferred)
    assert got == want


# ----------------------------------------------------------------------------- resumability
def test_interrupted_run_resumes_to_the_uninterrupted_table(traces, reference, tmp_path):
    _, ref_table = reference
    spec = spec_from_dict(thousand(traces), traces)
    store = tmp_path / "store"

    def stop(done, total):
        if done >= 300:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):   # no periodic chunk: only the write on the way out
        run_spec(spec, store, jobs=1, progress=stop, flush_conditions=10**6, flush_seconds=1e9, task_conditions=20)
    stored = len(ResultStore.open(store).done_pairs())
    assert 300 <= stored < 1000              # everything received before the interruption was kept
    assert len(list((store / "parts").glob("part-*.parquet"))) == 1
    assert not (store / "results.parquet").exists()
    report = run_spec(spec, store, jobs=1)
    assert report.n_skipped == stored and len(report.ran) == 1000 - stored
    assert pq.read_table(store / "results.parquet").equals(ref_table)


def test_killed_cli_run_resumes_to_the_uninterrupted_table(traces, reference, tmp_path):
    """SIGKILL a real `expertcache spec run` process as soon as its first chunk lands."""
    _, ref_table = reference
    (tmp_path / "a").symlink_to(traces / "a")
    (tmp_path / "thousand.toml").write_text(THOUSAND_TOML)
    store = tmp_path / "store"
    cmd = [sys.executable, "-c", "from expertcache.cli import main; main()", "spec", "run", str(tmp_path / "thousand.toml"),
           "--store", str(store), "--chunk-seconds", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list((store / "parts").glob("part-*.parquet")) and time.monotonic() < deadline:
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (store / "results.parquet").exists()       # it really died midway
    stored = len(ResultStore.open(store).done_pairs())
    assert 0 < stored < 1000
    res = subprocess.run(cmd[:-2] + ["--json"], capture_output=True, text=True, check=True)
    report = json.loads(res.stdout)
    assert report["n_skipped"] == stored and report["n_ran"] == 1000 - stored
    assert pq.read_table(store / "results.parquet").equals(ref_table)


def test_parallel_workers_give_the_identical_table(traces, reference, tmp_path):
    _, ref_table = reference
    run_spec(spec_from_dict(thousand(traces), traces), tmp_path / "s", jobs=2, task_conditions=30)
    assert pq.read_table(tmp_path / "s" / "results.parquet").equals(ref_table)


@pytest.mark.slow
def test_ray_executor_gives_the_identical_table(traces, reference, tmp_path):
    pytest.importorskip("ray")
    _, ref_table = reference
    report = run_spec(spec_from_dict(thousand(traces), traces), tmp_path / "s", executor="ray", jobs=2)
    assert len(report.ran) == 1000
    assert pq.read_table(tmp_path / "s" / "results.parquet").equals(ref_table)


# ----------------------------------------------------------------------------- spec changes
def _two_input_spec(root: Path) -> dict:
    return {"experiment": {"name": "change"}, "inputs": {"a": {"trace": "a"}, "b": {"trace": "b2"}},
            "selections": {"head": {"range": [0, 6]}},
            "grid": {"input": ["a", "b"], "selection": ["all", "head"], "batch": [2, 4],
                     "policy": ["lru", "belady"], "rho": [0.25, 0.5], "tie_seed": [0, 1]}}


def test_a_spec_change_reruns_exactly_the_affected_conditions(traces, tmp_path):
    root = tmp_path
    for name in ("a", "b2"):
        tiny(1 if name == "a" else 2).save(root / name)
    store = root / "store"
    d = _two_input_spec(root)
    first = run_spec(spec_from_dict(d, root), store, jobs=1)
    assert len(first.ran) == 2 * 2 * 2 * 2 * 2 * 2 == 64

    def ids(report_or_planned, **where):
        return {p.condition_id for p in report_or_planned
                if all(getattr(p.condition, k) == v for k, v in where.items())}

    # nothing changed: nothing runs
    assert run_spec(spec_from_dict(d, root), store, jobs=1).ran == ()
    # a new rho value: only its conditions
    d["grid"]["rho"] = [0.25, 0.5, 0.75]
    planned = expand(spec_from_dict(d, root))
    rep = run_spec(spec_from_dict(d, root), store, jobs=1)
    assert set(rep.ran) == ids(planned, rho=0.75) and len(rep.ran) == 32
    # input b's data replaced in place (same path, new manifest hash): only b's conditions
    before = read_results(store)
    tiny(3).save(root / "b2", overwrite=True)
    rep = run_spec(spec_from_dict(d, root), store, jobs=1)
    assert set(rep.ran) == ids(planned, input="b") and len(rep.ran) == 48
    after = read_results(store)

    def values(t, inp):
        keep = [i for i, x in enumerate(t["input"].to_pylist()) if x == inp]
        return t.take(keep).sort_by([("condition_id", "ascending"), ("metric", "ascending")])["value"].to_pylist()

    assert values(after, "a") == values(before, "a")
    assert values(after, "b") != values(before, "b")
    # the selection 'head' redefined: only conditions on it
    d["selections"]["head"] = {"range": [2, 8]}
    rep = run_spec(spec_from_dict(d, root), store, jobs=1)
    assert set(rep.ran) == ids(planned, selection="head") and len(rep.ran) == 48
    # a policy dropped: nothing runs, and the table holds only the spec's conditions
    d["grid"]["policy"] = ["lru"]
    rep = run_spec(spec_from_dict(d, root), store, jobs=1)
    assert rep.ran == () and rep.n_conditions == 48
    table = pq.read_table(store / "results.parquet")
    assert set(table["policy"].to_pylist()) == {"lru"}
    assert len(set(table["condition_id"].to_pylist())) == 48


# ----------------------------------------------------------------------------- CLI
def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_cli_expand_run_summary(traces, tmp_path):
    spec = traces / "small.toml"
    spec.write_text("""
[experiment]
name = "small"
[inputs.a]
trace = "a"
[grid]
input = "a"
batch = [2, 4]
policy = ["lru", "lfu", "belady"]
rho = [0.25, 0.5]
""")
    res = invoke("spec", "expand", spec, "--json")
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in res.output.splitlines()]
    assert len(rows) == 12 and len({r["condition_id"] for r in rows}) == 12
    store = tmp_path / "st"
    res = invoke("spec", "run", spec, "--store", store, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["n_ran"] == 12
    res = invoke("spec", "summary", store, "--metric", "gap", "--rows", "batch", "--cols", "rho", "--json")
    assert res.exit_code == 0, res.output
    cells = json.loads(res.output)["cells"]
    lib = summarize(read_results(store), "gap", ("batch",), ("rho",))
    assert [c["mean"] for c in cells] == [c.mean for c in lib.cells] and len(cells) == 4
    res = invoke("spec", "summary", store, "--metric", "miss_fraction", "--rows", "policy", "--where", "batch=4")
    assert res.exit_code == 0 and "belady" in res.output


@pytest.mark.parametrize("args, message", [
    (("spec", "run", "missing.toml", "--store", "x"), "spec file not found"),
    (("spec", "summary", "nowhere"), "no result store here"),
    (("spec", "summary", "STORE", "--metric", "nope"), "unknown metric 'nope'"),
    (("spec", "summary", "STORE", "--rows", "colour"), "cannot pivot"),
    (("spec", "run", "SPEC", "--store", "x", "--executor", "local", "--address", "auto"), "ray executor only"),
])
def test_cli_errors_are_one_line(traces, tmp_path, monkeypatch, args, message):
    spec = tmp_path / "s.toml"
    spec.write_text(f'[inputs.a]\ntrace = "{traces / "a"}"\n[grid]\ninput = "a"\nbatch = 2\npolicy = "lru"\nrho = 0.5\n')
    store = tmp_path / "store"
    run_spec(load_spec(spec), store, jobs=1)
    args = [str(store) if a == "STORE" else str(spec) if a == "SPEC" else a for a in args]
    monkeypatch.chdir(tmp_path)
    res = invoke(*args)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_example_specs_expand():
    root = Path(__file__).resolve().parents[1] / "examples" / "specs"
    assert len(expand(load_spec(root / "example.toml"))) == 2 * 2 * 3 * 5 * 3
    frozen = expand(load_spec(root / "frozen13.toml"))
    assert len(frozen) == 13 * 5 and len({p.condition.selection for p in frozen}) == 13
    transition = expand(load_spec(root / "transition.toml"))
    assert len(transition) == 12 * 2 * 2 * 2 * 5                  # 4 x 4 pools less the 4 self-pairs
    assert all(p.condition.warm not in (None, p.condition.selection) for p in transition)


def test_sigterm_stops_a_cli_run_gracefully(traces, reference, tmp_path):
    """SIGTERM acts like Ctrl-C: the CLI writes what it received, says so, exits 130; the run resumes."""
    _, ref_table = reference
    (tmp_path / "a").symlink_to(traces / "a")
    (tmp_path / "thousand.toml").write_text(THOUSAND_TOML)
    store = tmp_path / "store"
    cmd = [sys.executable, "-c", "from expertcache.cli import main; main()", "spec", "run",
           str(tmp_path / "thousand.toml"), "--store", str(store), "--chunk-seconds", "0.2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list((store / "parts").glob("part-*.parquet")) and time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be stopped"
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not (store / "results.parquet").exists()
    stored = len(ResultStore.open(store).done_pairs())
    assert 0 < stored < 1000
    report = run_spec(spec_from_dict(thousand(traces), tmp_path), store, jobs=1)
    assert len(report.ran) == 1000 - stored
    assert pq.read_table(store / "results.parquet").equals(ref_table)


def _spec_run_after(traces, tmp_path, monkeypatch, before):
    """``spec run`` on THOUSAND_TOML with ``run_spec`` replaced by one that calls ``before()`` and then reports
    progress three times: the CLI's result and the progress reports made."""
    import expertcache.experiment.runner as runner

    (tmp_path / "a").symlink_to(traces / "a")
    (tmp_path / "thousand.toml").write_text(THOUSAND_TOML)
    calls = []

    def fake_run_spec(spec, store, progress=None, **kwargs):
        before()
        for done in range(1, 4):
            calls.append(done)
            progress(done, 3)
        raise AssertionError("the run went on after SIGTERM")

    monkeypatch.setattr(runner, "run_spec", fake_run_spec)
    res = CliRunner().invoke(main, ["spec", "run", str(tmp_path / "thousand.toml"), "--store", str(tmp_path / "s")])
    return res, calls


def test_sigterm_swallowed_by_a_finalizer_still_stops_the_run(traces, tmp_path, monkeypatch):
    """Regression: a SIGTERM whose KeyboardInterrupt lands inside a ``__del__`` is swallowed by Python; the run
    must still stop at its next progress report and exit 130 (it once ran to completion and exited 0)."""

    def swallowed():
        try:  # what a finalizer does with an exception raised inside it
            os.kill(os.getpid(), signal.SIGTERM)
        except KeyboardInterrupt:
            pass

    res, calls = _spec_run_after(traces, tmp_path, monkeypatch, swallowed)
    assert res.exit_code == 130, res.output
    assert calls == [1] and "interrupted" in res.output


def test_sigterm_inside_a_finalizer_prints_no_traceback(traces, tmp_path, monkeypatch):
    """A SIGTERM that arrives while a ``__del__`` runs raises nothing there (Python would swallow the exception
    and print its traceback to stderr: "Exception ignored in ..."); the run stops at its next progress report."""
    import sys

    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):       # the handler runs at a bytecode boundary inside this finalizer
                pass

    res, calls = _spec_run_after(traces, tmp_path, monkeypatch, Finalized)
    assert res.exit_code == 130, res.output
    assert calls == [1] and "interrupted" in res.output
    assert unraisable == []


def test_sigterm_inside_numba_code_raises_nothing_there(traces, tmp_path, monkeypatch):
    """A SIGTERM that arrives while numba's own Python code runs (compiled code calls it back, e.g. to unpickle a
    kernel's result) raises nothing there: the exception would leave that call as a SystemError, a traceback and
    exit 1 (seen once in the test above). The run stops at its next progress report and exits 130."""
    ns: dict = {}
    exec(compile("import os, signal\n"
                 "def unpickle():\n"
                 "    os.kill(os.getpid(), signal.SIGTERM)\n"
                 "    for _ in range(100):\n"
                 "        pass\n", os.path.join(os.sep, "site-packages", "numba", "core", "serialize.py"), "exec"),
         ns)
    res, calls = _spec_run_after(traces, tmp_path, monkeypatch, ns["unpickle"])
    assert res.exit_code == 130, res.output
    assert calls == [1] and "interrupted" in res.output


def test_a_store_holds_one_experiment(traces, tmp_path):
    d = {"experiment": {"name": "one"}, "inputs": {"a": {"trace": "a"}},
         "grid": {"input": "a", "batch": 2, "policy": "lru", "rho": 0.5}}
    run_spec(spec_from_dict(d, traces), tmp_path / "s", jobs=1)
    d["experiment"]["name"] = "two"
    with pytest.raises(ValueError, match="holds experiment 'one'"):
        run_spec(spec_from_dict(d, traces), tmp_path / "s", jobs=1)


# ----------------------------------------------------------------------------- warm-transition units (§8.1)
def _metrics(table) -> dict:
    """condition_id -> {field: value, metric: value}."""
    cols = {n: table[n].to_pylist() for n in table.column_names}
    out: dict = {}
    for i, cid in enumerate(cols["condition_id"]):
        rec = out.setdefault(cid, {n: cols[n][i] for n in cols if n not in ("metric", "value")})
        rec[cols["metric"][i]] = cols["value"][i]
    return out


def test_warm_transition_units_equal_experiments_warm_transition(traces, tmp_path):
    """Spec units (warm = A, selection = B, window_requests = N) equal expertcache.experiments.warm_transition."""
    from expertcache.experiment.scoped import warm_transition

    tr = read_trace(traces / "a")
    labels = {r: ("x" if i < 6 else "y") for i, r in enumerate(tr.request_ids)}
    units, _ = warm_transition(tr, labels, windows=[2, 3], rhos=[0.25, 0.5], seeds=[0], batch=2, warm=3)
    # warm_transition's request order for seed 0: one permutation per category (sorted names) from one rng
    rng = np.random.default_rng([0, 8, 1])
    order = {"x": rng.permutation(np.arange(6)), "y": rng.permutation(np.arange(6, 12))}
    d = {"experiment": {"name": "transition"}, "inputs": {"a": {"trace": "a"}},
         "selections": {c: {"indices": order[c].tolist()} for c in order},
         "grid": {"input": "a", "warm": ["x", "y"], "selection": ["x", "y"], "warm_requests": 3,
                  "window_requests": [2, 3], "batch": 2, "rho": [0.25, 0.5],
                  "policy": ["lru", "lfu", "lfru", "belady"]}}
    planned = expand(spec_from_dict(d, traces))
    assert len(planned) == 2 * 2 * 2 * 4                      # x->x and y->y are left out
    run_spec(spec_from_dict(d, traces), tmp_path / "s", jobs=1)
    got = {}
    for rec in _metrics(read_results(tmp_path / "s")).values():
        got[(rec["warm"], rec["selection"], rec["window_requests"], rec["rho"], rec["policy"])] = rec
    assert len(units) == len(got) // 4 == 8
    for u in units:
        for p, m in u.miss_fraction.items():
            rec = got[(u.source, u.target, u.window, u.rho, p)]
            assert rec["miss_fraction"] == m
            assert rec["warmup_events"] == u.warmup_events > 0
            assert rec["n_events"] == u.counted_events > 0
    # the gap pivot by window reproduces the units' gaps (best of lru/lfu/lfru, as warm_transition)
    table = read_results(tmp_path / "s")
    for u in units:
        cell = summarize(table, "gap", ("warm", "selection"), ("window_requests",),
                         where={"rho": u.rho, "warm": u.source, "selection": u.target,
                                "window_requests": u.window}).cells
        assert len(cell) == 1 and cell[0].mean == pytest.approx(u.gap, abs=1e-15)


def _naive_first_step(lengths, arrivals, batch, first_request):
    """First step at which FCFS continuous batching serves a request >= first_request (a step-by-step loop)."""
    waiting = sorted(range(len(lengths)), key=lambda r: (arrivals[r], r))
    left = list(lengths)
    running: list[int] = []
    step = 0
    while waiting or running:
        for r in list(waiting):
            if len(running) < batch and arrivals[r] <= step:
                running.append(r)
                waiting.remove(r)
            elif arrivals[r] > step:
                break
        if any(r >= first_request for r in running):
            return step
        for r in running:
            left[r] -= 1
        running = [r for r in running if left[r] > 0]
        step += 1
    raise AssertionError("never served")


def test_warm_transition_with_order_seed_and_offsets_equals_direct_replay(traces, tmp_path):
    tr = read_trace(traces / "a")
    d = {"experiment": {"name": "t"}, "inputs": {"a": {"trace": "a"}},
         "selections": {"first6": {"range": [0, 6]}, "last6": {"range": [6, 12]}},
         "grid": [{"input": "a", "warm": "first6", "selection": "last6", "warm_requests": 4, "window_requests": 3,
                   "order_seed": 5, "offsets": "stagger:1", "batch": 2, "rho": 0.4, "policy": ["lru", "belady"]},
                  {"input": "a", "selection": "last6", "window_requests": 3, "order_seed": 5,
                   "offsets": "stagger:1", "batch": 2, "rho": 0.4, "policy": ["lru"]}]}
    run_spec(spec_from_dict(d, traces), tmp_path / "s", jobs=1)
    recs = {(r["warm"], r["policy"]): r for r in _metrics(read_results(tmp_path / "s")).values()}
    warm = np.arange(6)[np.random.default_rng([5, 0, 1]).permutation(6)][:4]
    window = np.arange(6, 12)[np.random.default_rng([5, 0]).permutation(6)][:3]
    offsets = ArrivalOffsets("stagger", stagger=1)
    sub = select_requests(tr, np.concatenate([warm, window]))
    s = build_events(sub, 2, offsets)
    lengths = [int((sub.request[sub.phase == 1] == r).sum()) for r in range(sub.n_requests)]
    first = _naive_first_step(lengths, [r for r in range(sub.n_requests)], 2, 4)
    n_warm = int((s.step < first).sum())
    assert 0 < n_warm < s.n_events
    for p in ("lru", "belady"):
        r = replay(s, ReplayConfig(p, rho=0.4, warmup_events=n_warm))
        rec = recs[("first6", p)]
        assert (rec["transferred"], rec["hits"], rec["logical"], rec["warmup_events"]) == \
               (r.transferred, r.hits, r.logical, n_warm)
        assert rec["transferred"] != replay(s, ReplayConfig(p, rho=0.4)).transferred   # the warm-up matters
    # the cold reference (no warm-up) replays exactly the same window requests
    cold = replay(build_events(select_requests(tr, window), 2, offsets), ReplayConfig("lru", rho=0.4))
    rec = recs[(None, "lru")]
    assert (rec["transferred"], rec["logical"], rec["warmup_events"]) == (cold.transferred, cold.logical, 0)


def test_stream_inputs_honour_the_manifest_warmup_events(traces, tmp_path):
    """A prefill-initialised / concatenated stream is counted as `expertcache replay` counts it."""
    from expertcache.events import concat_streams

    tr = read_trace(traces / "a")
    first = build_events(select_requests(tr, range(6)), 2)
    joined = concat_streams(first, build_events(select_requests(tr, range(6, 12)), 2),
                            provenance={"warmup_events": first.n_events})
    joined.save(tmp_path / "joined")
    d = {"inputs": {"j": {"stream": "joined"}}, "grid": {"input": "j", "policy": "lfu", "rho": 0.5}}
    run_spec(spec_from_dict(d, tmp_path), tmp_path / "s", jobs=1)
    rec = next(iter(_metrics(read_results(tmp_path / "s")).values()))
    want = replay(joined, ReplayConfig("lfu", rho=0.5, warmup_events=first.n_events))
    assert (rec["transferred"], rec["logical"], rec["warmup_events"]) == \
           (want.transferred, want.logical, first.n_events)
    assert rec["logical"] < joined.logical


def test_warm_transition_ids_and_hashes(traces, tmp_path):
    import hashlib

    base = {"inputs": {"a": {"trace": "a"}},
            "selections": {"p": {"range": [0, 6]}, "q": {"range": [6, 12]}},
            "grid": {"input": "a", "selection": "q", "batch": 2, "policy": "lru", "rho": 0.4}}
    plain = expand(spec_from_dict(base, traces))[0]
    # a condition without a warm-up keeps its format-1 ID: the digest of its original fields
    old = {k: v for k, v in plain.condition.params().items()
           if k not in ("warm", "warm_requests", "window_requests")}
    canon = json.dumps({"format": 1, "params": old}, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert plain.condition_id == "c" + hashlib.sha256(canon.encode()).hexdigest()[:16]
    warm = json.loads(json.dumps(base))
    warm["grid"].update(warm="p", warm_requests=[3, 4])
    a, b = expand(spec_from_dict(warm, traces))
    assert len({a.condition_id, b.condition_id, plain.condition_id}) == 3
    # redefining the warm selection changes the hash, not the ID
    warm["selections"]["p"] = {"range": [1, 6]}
    a2, _ = expand(spec_from_dict(warm, traces))
    assert a2.condition_id == a.condition_id and a2.condition_hash != a.condition_hash
    # and a stream input ignores the warm axes
    build_events(read_trace(traces / "a"), 2).save(tmp_path / "s")
    grid = {"input": "a", "warm": "p", "policy": "lru", "rho": 0.4}
    assert expand(spec_from_dict({"inputs": {"a": {"stream": "s"}}, "grid": grid}, tmp_path))[0].condition.warm \
        is None


@pytest.mark.parametrize("grid, message", [
    ({"warm": "nope"}, "unknown selection 'nope'"),
    ({"warm": "p", "discipline": "rotation"}, "needs the fcfs discipline"),
    ({"warm_requests": 2}, "warm_requests needs warm"),
    ({"warm": "p", "warm_requests": 7}, "warm_requests = 7 exceeds the 6 requests of selection 'p'"),
    ({"window_requests": 0}, "window_requests must be a positive integer"),
    ({"window_requests": 7}, "window_requests = 7 exceeds the 6 requests of selection 'q'"),
    ({"offsets": "stagger:x"}, "grid[0]"),
    ({"warm": "q"}, "every combination pairs a warm selection with itself"),
])
def test_bad_warm_transition_axes(traces, grid, message):
    d = {"inputs": {"a": {"trace": "a"}}, "selections": {"p": {"range": [0, 6]}, "q": {"range": [6, 12]}},
         "grid": {"input": "a", "selection": "q", "batch": 2, "policy": "lru", "rho": 0.4, **grid}}
    with pytest.raises(ValueError, match=re.escape(message)):
        expand(spec_from_dict(d, traces))


def test_overlapping_warm_and_window_selections_are_refused(traces, tmp_path):
    d = {"inputs": {"a": {"trace": "a"}}, "selections": {"p": {"range": [0, 6]}, "q": {"range": [4, 12]}},
         "grid": {"input": "a", "warm": "p", "selection": "q", "batch": 2, "policy": "lru", "rho": 0.4}}
    with pytest.raises(ValueError, match="share 2 request"):
        run_spec(spec_from_dict(d, traces), tmp_path / "s", jobs=1)


def test_a_stream_input_with_a_calibration_trace_is_refused_at_load(traces, tmp_path):
    build_events(read_trace(traces / "a"), 2).save(tmp_path / "s")
    d = {"inputs": {"s": {"stream": "s", "calibration": str(traces / "b")}},
         "grid": {"input": "s", "policy": "static", "rho": 0.4}}
    with pytest.raises(ValueError, match="a stream input needs a calibration stream"):
        spec_from_dict(d, tmp_path)


def test_selections_must_be_tables(traces):
    d = {"inputs": {"a": {"trace": "a"}}, "selections": 3,
         "grid": {"input": "a", "batch": 2, "policy": "lru", "rho": 0.4}}
    with pytest.raises(ValueError, match=re.escape("selections must be tables")):
        spec_from_dict(d, traces)


# ----------------------------------------------------------------------------- store portability
def test_store_works_without_fcntl_and_says_why_it_cannot_lock(traces, tmp_path):
    """Reading results needs no fcntl; locking without fcntl or msvcrt is a clear error, not an ImportError."""
    d = {"inputs": {"a": {"trace": "a"}}, "grid": {"input": "a", "batch": 2, "policy": "lru", "rho": 0.5}}
    run_spec(spec_from_dict(d, traces), tmp_path / "s", jobs=1)
    code = ("import sys; sys.modules['fcntl'] = None; sys.modules['msvcrt'] = None\n"
            "from expertcache.experiment.store import ResultStore, read_results\n"
            f"print(read_results({str(tmp_path / 's')!r}).num_rows)\n"
            "try:\n"
            f"    with ResultStore.open({str(tmp_path / 's')!r}).lock(): pass\n"
            "except ValueError as e: print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    n_rows, refusal = out.stdout.splitlines()
    assert int(n_rows) == len(read_results(tmp_path / "s"))
    assert refusal.startswith("refused:") and "neither fcntl nor msvcrt" in refusal


def test_a_second_concurrent_run_is_refused(traces, tmp_path):
    d = {"inputs": {"a": {"trace": "a"}}, "grid": {"input": "a", "batch": 2, "policy": "lru", "rho": 0.5}}
    store = ResultStore.open(tmp_path / "s", create=True)
    code = ("from expertcache.experiment.store import ResultStore\n"
            f"with ResultStore.open({str(tmp_path / 's')!r}).lock(): print('locked', flush=True); input()\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match="another run holds this store's lock"):
            run_spec(spec_from_dict(d, traces), store.path, jobs=1)
    finally:
        holder.communicate("\n", timeout=60)
    assert len(run_spec(spec_from_dict(d, traces), store.path, jobs=1).ran) == 1


def test_a_format_1_table_is_read_with_null_warm_fields(traces, tmp_path):
    d = {"inputs": {"a": {"trace": "a"}}, "grid": {"input": "a", "batch": 2, "policy": "lru", "rho": 0.5}}
    run_spec(spec_from_dict(d, traces), tmp_path / "s", jobs=1)
    t = pq.read_table(tmp_path / "s" / "results.parquet").drop_columns(["warm", "warm_requests", "window_requests"])
    pq.write_table(t, tmp_path / "old.parquet")
    back = read_results(tmp_path / "old.parquet")
    assert back["warm"].null_count == back.num_rows and back["value"].equals(t["value"])


def test_traces_with_prefill_rows_give_the_decode_schedules_of_the_full_trace(tmp_path):
    """Workers keep decode rows only; every discipline must give the events of the full trace."""
    tr = synthesize_trace(SynthConfig(n_layers=2, n_experts=8, top_k=2, n_requests=8, decode_tokens=5,
                                      prefill_tokens=4, working_set=4, seed=3))
    assert (tr.phase == 0).sum() > 0
    tr.save(tmp_path / "p")
    d = {"inputs": {"p": {"trace": "p"}}, "selections": {"a": {"range": [0, 4]}, "b": {"range": [4, 8]}},
         "grid": [{"input": "p", "selection": "b", "warm": ["a", None], "order_seed": 2, "batch": 2,
                   "policy": "lru", "rho": 0.5},
                  {"input": "p", "discipline": "rotation", "admitted": 4, "batch": 2, "window": 2,
                   "policy": "lru", "rho": 0.5}]}
    run_spec(spec_from_dict(d, tmp_path), tmp_path / "s", jobs=1)
    got = {(r["warm"], r["discipline"]): (r["transferred"], r["logical"], r["warmup_events"])
           for r in _metrics(read_results(tmp_path / "s")).values()}
    warm = np.arange(4)[np.random.default_rng([2, 0, 1]).permutation(4)]
    window = np.arange(4, 8)[np.random.default_rng([2, 0]).permutation(4)]
    s = build_events(select_requests(tr, np.concatenate([warm, window])), 2)
    n_warm = int(got[("a", "fcfs")][2])
    cold = replay(build_events(select_requests(tr, window), 2), ReplayConfig("lru", rho=0.5))
    rot = replay(rotation_events(tr, RotationConfig(4, 2, 2))[0], ReplayConfig("lru", rho=0.5))
    warm_r = replay(s, ReplayConfig("lru", rho=0.5, warmup_events=n_warm))
    assert got == {("a", "fcfs"): (warm_r.transferred, warm_r.logical, n_warm),
                   (None, "fcfs"): (cold.transferred, cold.logical, 0),
                   (None, "rotation"): (rot.transferred, rot.logical, 0)}


def test_nested_selections_apply_the_heads_of_their_parts(traces):
    """sample/concat over a concat with "name:N" parts draw from the truncated parts (as their sizes say)."""
    from expertcache.experiment.tasks import select_indices

    tr = read_trace(traces / "a")
    sels = {"all": {"kind": "all", "params": []},
            "first6": {"kind": "range", "params": [["range", [0, 6]]]},
            "last6": {"kind": "range", "params": [["range", [6, 12]]]},
            "mix": {"kind": "concat", "params": [["concat", ["first6:2", "last6:1"]]]},
            "s": {"kind": "sample", "params": [["from", "mix"], ["sample", 3], ["seed", 0]]},
            "outer": {"kind": "concat", "params": [["concat", ["mix", "last6:3"]]]}}
    assert sorted(select_indices(tr, "s", None, sels).tolist()) == [0, 1, 6]
    with pytest.raises(ValueError, match="names a request twice"):      # mix holds 6; last6:3 holds 6 too
        select_indices(tr, "outer", None, sels)
    sels["outer"]["params"] = [["concat", ["mix", "first6:3"]]]
    with pytest.raises(ValueError, match="names a request twice"):
        select_indices(tr, "outer", None, sels)
    sels["outer"]["params"] = [["concat", ["mix"]]]
    assert select_indices(tr, "outer", None, sels).tolist() == [0, 1, 6]
