"""The report and the §5 diagnostics on a trace not made by the project's own model: what the block *says*.

Every expected value here is derived by hand or recomputed from the raw arrays, never read back from the
code under test.
"""

from __future__ import annotations

import json
import math
import random
import re
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from expertcache.audit import RouteAuditConfig, positive_control, route_audit, workload_block
from expertcache.cli import main
from expertcache.events import build_events, decode_rows
from expertcache.trace import read_trace

DATA = Path(resources.files("expertcache")) / "data"


def _block_line(block: str, name: str) -> str:
    hits = [x for x in block.splitlines() if x.strip().startswith(name + " ..")]
    assert len(hits) == 1, name
    return re.sub(r"^\s*" + re.escape(name) + r" \.+ ", "", hits[0])


def _nearest_rank(values, q=95):
    """The smallest value with at least q% of the values at or below it, by hand."""
    v = sorted(values)
    return v[math.ceil(q / 100 * len(v)) - 1]


def _mixtral_rows(lengths, L=3, seed=3, categories=None):
    rng = random.Random(seed)
    rows = []
    for pid, n in enumerate(lengths):
        for t in range(n):
            for layer in range(L):
                e = rng.sample(range(8), 2)
                if pid == 0 and t == 0 and layer == 0:
                    e = [7, 0]   # N inferred = 8
                g = rng.random()
                rows.append({"dataset": "d", "problem_id": pid, "layer": layer, "experts": e,
                             "gating_probs": [g, 1 - g], "token_idx": t})
    rows.append({"dataset": "d", "problem_id": 3, "layer": 0, "experts": [1, 2], "gating_probs": [0.5, 0.5],
                 "token_idx": lengths[3]})     # a token with one layer only: dropped as incomplete
    return rows


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """4 requests of unequal length (9, 6, 4, 7 decode tokens), L = 3, N inferred as 8, imported by the CLI."""
    d = tmp_path_factory.mktemp("imp")
    src = d / "mix.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in _mixtral_rows([9, 6, 4, 7])))
    res = CliRunner().invoke(main, ["trace", "import", "--format", "mixtral-jsonl", str(src), "-o", str(d / "tr")])
    assert res.exit_code == 0, res.output
    out = d / "rep"
    res = CliRunner().invoke(main, ["report", str(d / "tr"), "-o", str(out), "--no-figures", "--seed", "0,1",
                                    "--permutations", "0", "--sweep-batch", "2,4,8,16", "--sweep-rho", "0.4"])
    assert res.exit_code == 0, res.output
    return d / "tr", out


def test_imported_trace_block_carries_the_caveats(imported):
    _, out = imported
    block = (out / "block.txt").read_text()
    assert "lower bound" in _block_line(block, "experts N, top-k, layers")
    assert _block_line(block, "experts N, top-k, layers").startswith("8 / 2 / 3")
    # rho = 0.4, L = 3, N = 8: floor(9.6 + 0.5) = 10 blocks -> quotas 4, 3, 3
    cap = _block_line(block, "capacity per layer")
    assert cap.startswith("3-4 blocks") and "10 in all" in cap and "lower bound" in cap
    # 4 requests: at B = 8 at most 4 active; mean over steps by hand from the FCFS schedule (9, 6, 4, 7 tokens):
    # steps 0-3: 4 active, 4-5: 3, 6: 2, 7-8: 1 -> (16 + 6 + 2 + 2) / 9
    conc = _block_line(block, "concurrency")
    assert "at most 4 active" in conc and f"mean {26 / 9:.2f}" in conc and "only 4 requests" in conc
    assert _block_line(block, "position-locked cohorts").startswith("yes (4 of 4 requests start decoding")
    jac = _block_line(block, "expert Jaccard | low-text-overlap")
    assert "no token ids" in jac and "not by text overlap" in jac
    bytes_line = _block_line(block, "absolute bytes per output token")
    assert "blocks per output token" in bytes_line and "pass --block-bytes" in bytes_line
    assert _block_line(block, "matched-pair attribution (B8)") == "not measured: no fixed arm"
    data = json.loads((out / "report.json").read_text())
    tok = data["traffic"]["output_tokens"]
    assert tok == 26
    assert f"{data['traffic']['blocks_per_token_causal']:.4g} blocks per output token" in bytes_line


def test_imported_report_md_says_what_the_import_did(imported):
    _, out = imported
    md = (out / "report.md").read_text()
    sec = md.split("## What the import inferred and dropped", 1)[1].split("## ", 1)[0]
    assert "inferred: top_k, n_layers, n_experts" in sec
    assert "dropped: 1 incomplete steps" in sec and "lower bound" in sec


def test_batch_sweep_says_why_rows_repeat(imported):
    _, out = imported
    md = (out / "report.md").read_text()
    assert "B = 4, 8, 16 schedule every request at once" in md
    rows = json.loads((out / "report.json").read_text())["batch_sweep"]
    assert [r["max_active"] for r in rows] == [2, 4, 4, 4]


def test_conformance_field_is_run_not_printed(imported, monkeypatch, tmp_path):
    tr, _ = imported
    import expertcache.conformance as conf

    monkeypatch.setitem(conf.EXPECTED, "event-atomic", (13, 17))   # a wrong expectation must show
    from expertcache.report import ReportConfig, build_report

    rep = build_report(tr, ReportConfig(seeds=(0,), n_permutations=0, batches=(8,), rhos=(0.4,)))
    assert _block_line(rep.block, "conformance trace").startswith("FAILED")
    monkeypatch.setitem(conf.EXPECTED, "event-atomic", (12, 18))
    rep = build_report(tr, ReportConfig(seeds=(0,), n_permutations=0, batches=(8,), rhos=(0.4,)))
    assert _block_line(rep.block, "conformance trace").startswith("yes (expertcache conformance, run by this report")


def test_gap_labels_and_static_identity(imported):
    _, out = imported
    block = (out / "block.txt").read_text()
    assert "mean of tie seeds 0,1" in _block_line(block, "offline bound reported")
    assert "the best of lru/lfu/lfru/least-stale" in _block_line(block, "offline bound reported")
    md = (out / "report.md").read_text()
    assert "gap (tie seed 0)" in md and "simulated (replay)" in md
    for row in json.loads((out / "report.json").read_text())["static_access_share"]:
        assert row["simulated_union_miss_ratio"] == pytest.approx(row["predicted_union_miss_ratio"], abs=1e-12)


def test_p95_is_nearest_rank():
    # 20 events (one layer) with union sizes 1..20: nearest-rank p95 = 19 (interpolation would give 19.05)
    import tempfile

    from expertcache.analysis import regime_stats
    from expertcache.events import import_events_jsonl

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "ev.jsonl"
        p.write_text("".join(json.dumps({"step": s, "layer": 0, "active": 1,
                                         "experts": list(range(s + 1))}) + "\n" for s in range(20)))
        stream = import_events_jsonl(p, n_layers=1, n_experts=20, top_k=20)
    rs = regime_stats(stream, 0.5)
    assert rs.union_p95 == 19.0 == _nearest_rank(range(1, 21))


def test_positional_agreement_p95_is_within_category():
    """12 categories of 2 requests, each pair routed identically; cross pairs never agree.

    Within-category agreement is 1 for all 12 pairs; pooled with the 264 cross pairs it is 0 at the 95th
    percentile (12 / 276 < 5%). B6 asks for the within-category figure.
    """
    from expertcache.trace import DECODE, RoutingTrace

    R, T, L, N, k = 24, 6, 2, 16, 2
    rng = np.random.default_rng(0)
    base = [np.stack([np.stack([rng.choice(N, k, replace=False) for _ in range(L)]) for _ in range(T)])
            for _ in range(12)]
    experts = np.concatenate([base[r // 2] for r in range(R)]).astype(np.int32)
    request = np.repeat(np.arange(R), T)
    position = np.tile(np.arange(T), R)
    tr = RoutingTrace(L, N, k, [f"r{i}" for i in range(R)], request, np.full(R * T, DECODE, dtype=np.int8),
                      position, experts, None, np.full(R * T, -1), {})
    labels = {f"r{i}": f"c{i // 2}" for i in range(R)}
    route = route_audit(tr, labels, RouteAuditConfig())
    assert route.within_agreement_p95 == 1.0 and route.overall_agreement_p95 == 0.0
    block = workload_block(tr, labels)
    assert "p95 100.00% over within-category pairs" in block["positional_token_agreement"]


def test_positive_control_copies_from_a_long_enough_record():
    tr = read_trace(DATA / "example_model_trace")
    lengths, _ = decode_rows(tr)
    assert lengths[0] == 10 and lengths.max() == 64       # request 0 is short: the old default copied 10
    r16 = positive_control(tr, None, 16)
    r64 = positive_control(tr, None, 64)
    assert r64.copied_positions == 64 == r64.requested_positions
    src = tr.request_ids.index(r64.source_request)
    assert lengths[src] >= 64
    assert r16.copied_positions == 16
    assert r64.injected_agreement_mean > r16.injected_agreement_mean


def test_b8_not_measured_without_a_fixed_arm():
    tr = read_trace(DATA / "example_trace")
    assert workload_block(tr)["matched_pair_attribution"] == "not measured: no fixed arm"


@pytest.mark.parametrize("example", [
    "example_model_trace",                                               # the bundled trace of the example model
    pytest.param("example_trace", marks=pytest.mark.slow),               # `report --example` (80 s of naive replay)
])
def test_block_numbers_on_the_bundled_example_match_an_independent_recomputation(tmp_path, example):
    """Union, capacity, r, concurrency, Belady, gap and blocks per token, recomputed from the raw arrays."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from naive import naive_replay

    out = tmp_path / "rep"
    src = ["--example"] if example == "example_trace" else [str(DATA / example)]
    res = CliRunner().invoke(main, ["report", *src, "-o", str(out), "--no-figures", "--seed", "0",
                                    "--permutations", "0", "--sweep-batch", "8", "--sweep-rho", "0.4"])
    assert res.exit_code == 0, res.output
    block = (out / "block.txt").read_text()
    tr = read_trace(DATA / example)
    s = build_events(tr, 8)
    L, N = tr.n_layers, tr.n_experts
    sizes = np.diff(s.offsets)
    total = math.floor(0.4 * L * N + 0.5)
    caps = [total // L + (1 if l < total % L else 0) for l in range(L)]
    r = sizes / np.array(caps)[s.layer]
    assert _block_line(block, "union per layer-step") == (f"mean {sizes.mean():.2f}, p95 {_nearest_rank(sizes)} "
                                                           "(nearest rank)")
    assert _block_line(block, "capacity per layer").startswith(f"{min(caps)}-{max(caps)} blocks")
    assert _block_line(block, "r(s,l) = union / capacity") == (
        f"mean {r.mean():.3f}, p95 {_nearest_rank(r):.3f}, fraction > 1 {(r > 1).mean():.2%}")
    per_step = {}
    for st, a in zip(s.step.tolist(), s.active.tolist(), strict=True):
        per_step[st] = a
    assert _block_line(block, "concurrency") == f"B = 8 (mean {np.mean(list(per_step.values())):.2f} active per step)"
    causal = ("lru", "lfu", "lfru", "least-stale")          # the §7.1 set the block names
    miss = {p: naive_replay(s, p, seed=0)["demand_misses"] / s.logical for p in (*causal, "belady", "belady-forced")}
    best = min(causal, key=lambda p: (miss[p], p))
    gap = (miss[best] - miss["belady"]) / miss[best]
    assert _block_line(block, "offline bound reported") == (
        f"yes (Belady m = {miss['belady']:.2%}; gap {gap:.2%} vs {best}, the best of lru/lfu/lfru/least-stale; "
        "mean of tie seeds 0)")
    adm = (miss["belady-forced"] - miss["belady"]) / (miss[best] - miss["belady"])
    assert _block_line(block, "forced-admission decomposition") == f"{adm:.2%} / {1 - adm:.2%}"
    tokens = sum(per_step.values())
    t_best = naive_replay(s, best, seed=0)["transferred"] / tokens
    t_off = naive_replay(s, "belady", seed=0)["transferred"] / tokens
    bb = tr.provenance.get("expert_block_bytes")
    want = (f"{t_off * bb:.4g} offline, {t_best * bb:.4g} best causal ({best})" if bb else
            f"{t_best:.4g} blocks per output token best causal ({best}), {t_off:.4g} offline")
    assert _block_line(block, "absolute bytes per output token").startswith(want)


# ------------------------------------------------------------------------------------------ §8-§9 experiments
EXAMPLE_MODEL = DATA / "example_model_trace"


def test_per_step_transferred_by_hand():
    from expertcache.events import EventStream
    from expertcache.experiment.scoped import nearest_rank, per_step_transferred
    from expertcache.replay import ReplayConfig

    # one layer, capacity 1, LRU: {0} miss, {1} miss, {0} miss, {0} hit; two layers at step 4: both miss
    s = EventStream.from_lists(2, 4, 1, steps=[0, 1, 2, 3, 4, 4], layers=[0, 0, 0, 0, 0, 1],
                               experts=[[0], [1], [0], [0], [2], [3]], active=[1] * 6)
    per = per_step_transferred(s, ReplayConfig("lru", capacity=(1, 1), tie_break="id"))
    assert per.tolist() == [1, 1, 1, 0, 2]
    assert nearest_rank(per) == 2 and nearest_rank([1, 2, 3, 4], 50) == 2


def test_affinity_dp99_depends_on_the_policy_and_scope_names_the_protocol():
    res = CliRunner().invoke(main, ["affinity", str(EXAMPLE_MODEL), "--best-of", "0", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    rows = {r["policy"]: r for r in out["rows"]}
    assert set(rows) == {"lfru", "static"}
    assert rows["lfru"]["delta_p99_causal"] != rows["static"]["delta_p99_causal"]
    # the latency proxy is its own column and is the schedule's, not the policy's
    assert rows["lfru"]["delta_latency_p99_causal"] == rows["static"]["delta_latency_p99_causal"]
    assert out["scope"]["static_protocol"].startswith("frozen: pin list fitted once on the 28 even requests")
    res = CliRunner().invoke(main, ["affinity", str(EXAMPLE_MODEL), "--best-of", "0", "--json", "--policy",
                                    "static-same-trace", "--tie-break", "id"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert "diagnostic, refitted on each scheduler's own trajectory" in out["scope"]["static_protocol"]
    assert out["scope"]["tie_break"] == "id"


def test_affinity_share_is_na_below_the_threshold_and_small_traces_warn(tmp_path):
    from expertcache.events.rotation import RotationConfig
    from expertcache.experiment.scoped import SHARE_MIN_GAIN, affinity_experiment

    tr = read_trace(EXAMPLE_MODEL)
    rows, _ = affinity_experiment(tr, RotationConfig(24, 8, 4), policies=("lfru", "lru", "lfu", "static-same-trace"))
    for r in rows:
        assert (r.share is None) == (abs(r.oracle_gain) < SHARE_MIN_GAIN), r
    tiny = tmp_path / "tiny"
    from expertcache.trace import select_requests

    select_requests(tr, np.arange(10), "ten requests").save(tiny)
    res = CliRunner().invoke(main, ["affinity", str(tiny), "--best-of", "0", "--policy", "lfru"])
    assert res.exit_code == 0, res.output
    assert "WARNING: the trace has 10 requests but 24 admitted sessions" in res.output
    res = CliRunner().invoke(main, ["experiment", "disciplines", str(tiny), "--tie-break", "id"])
    assert res.exit_code == 0, res.output
    assert "WARNING" in res.output and "tie_break id" in res.output


def test_least_stale_equals_lru_without_prefetch():
    """The note on the Least-Stale row, checked on the engine's own least-stale policy (not the proactive replay)."""
    from expertcache.replay import ReplayConfig, replay
    from expertcache.replay.proactive import ProactiveConfig, replay_proactive

    tr = read_trace(EXAMPLE_MODEL)
    for batch in (1, 8):
        s = build_events(tr, batch)
        for tie in ("random", "id"):
            ls = replay(s, ReplayConfig("least-stale", rho=0.25, tie_break=tie)).transferred
            assert ls == replay(s, ReplayConfig("lru", rho=0.25, tie_break=tie)).transferred
            assert ls == replay_proactive(s, ProactiveConfig("lru", rho=0.25, tie_break=tie)).demand_misses


# ------------------------------------------------------------------------------------------------ figures
def _report_files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_two_report_runs_are_byte_identical_and_figures_read_right(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "rep"
    args = ["report", "--example", "-o", str(out), "--seed", "0,1", "--permutations", "3", "--sweep-batch", "2,8",
            "--sweep-rho", "0.3,0.4"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    first = _report_files(out)
    import shutil

    shutil.rmtree(out)
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    second = _report_files(out)
    assert any(k.endswith(".svg") for k in first)
    assert first.keys() == second.keys()
    assert [k for k in first if first[k] != second[k]] == []
    svg = {k: v.decode() for k, v in first.items() if k.endswith(".svg")}
    assert all("<dc:date>" not in s for s in svg.values())
    for name in ("gap_vs_batch", "gap_vs_rho"):            # twin axes: one legend for both, the r = 1 line named
        s = svg[f"figures/{name}.svg"]
        assert "r = 1: union = capacity" in s and "left axis" in s and "right axis" in s
    data = json.loads(first["report.json"])
    best = data["gap"]["best_causal"]
    assert best in data["curves"] and f"{best} (best causal" in svg["figures/miss_ratio_curves.svg"]
    assert "union size |E(s,l)|" in svg["figures/event_ratio_histogram.svg"]


def test_permutation_figure_starts_at_zero_with_integer_ticks(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from expertcache.report import ReportConfig, build_report
    from expertcache.report.figures import _figures

    rep = build_report(DATA / "example_trace", ReportConfig(seeds=(0,), n_permutations=3, batches=(8,), rhos=(0.4,)))
    seen = {}
    orig = plt.close

    def keep(fig=None):
        if fig is not None and hasattr(fig, "axes") and fig.axes:
            seen[fig.axes[0].get_title()] = fig
        return orig(fig)

    import expertcache.report.figures as F  # noqa: F401

    plt.close = keep
    try:
        (tmp_path / "f").mkdir()
        _figures(rep, tmp_path / "f")
    finally:
        plt.close = orig
    fig = next(f for t, f in seen.items() if "only temporal order changes" in t)
    ax = fig.axes[0]
    assert ax.get_ylim()[0] == 0
    assert [t for t in ax.get_xticks()] == [1, 2, 3]


def test_prefetch_plot_title_is_no_absolute_path(tmp_path):
    pytest.importorskip("matplotlib")
    from expertcache.prefetch.comparison import CompareConfig, compare, plot_compare

    tr = read_trace(EXAMPLE_MODEL)
    rep = compare(tr, CompareConfig(capacity=8, policies=("lru",)), label=str(EXAMPLE_MODEL.resolve()))
    out = plot_compare(rep, tmp_path / "p.svg")
    text = Path(out).read_text()
    assert str(EXAMPLE_MODEL.resolve()) not in text and "example_model_trace: c = 8" in text


def test_b8_is_measured_on_the_bundled_matched_example(tmp_path):
    """The bundled matched-arm example: 4 archetypes x 2 splits x 2 sources rendered in both arms = 16 pairs."""
    labels = DATA / "example_matched_labels.jsonl"
    rows = [json.loads(x) for x in labels.read_text().splitlines()]
    assert sum(r["arm"] == "fixed" for r in rows) == 16 and len(rows) == 48
    out = tmp_path / "rep"
    res = CliRunner().invoke(main, ["report", str(DATA / "example_matched_trace"), "--labels", str(labels), "-o",
                                    str(out), "--no-figures", "--seed", "0", "--permutations", "0", "--sweep-batch", "8",
                                    "--sweep-rho", "0.4"])
    assert res.exit_code == 0, res.output
    b8 = _block_line((out / "block.txt").read_text(), "matched-pair attribution (B8)")
    assert b8.startswith("fixed minus diverse arm, union reduction: band 0-16 ")
    assert "(16 matched sources in 4 categories, cohorts of 4)" in b8
    from expertcache.audit import matched_attribution, read_arms

    tr = read_trace(DATA / "example_matched_trace")
    m = matched_attribution(tr, str(labels), read_arms(labels))
    lo = min(r.attributable[0] for r in m.rows)
    hi = max(r.attributable[0] for r in m.rows)
    assert f"band 0-16 {lo:+.1%}-{hi:+.1%}" in b8
    # without the labels the same trace has no arm: B8 says so
    assert workload_block(tr)["matched_pair_attribution"] == "not measured: no fixed arm"
