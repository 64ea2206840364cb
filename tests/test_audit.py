"""Route-side audit, matched pairs, workload locality and controls on constructed traces."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from expertcache.audit import (
    Arms,
    Band,
    LocalityConfig,
    RouteAuditConfig,
    decode_view,
    inject_shared_prefix,
    matched_attribution,
    pair_stats,
    positive_control,
    route_audit,
    union_ratio_by_band,
    workload_block,
    workload_locality,
)
from expertcache.cli import main
from expertcache.errors import ValidationError
from expertcache.trace import DECODE, PREFILL, RoutingTrace, read_trace

EXAMPLE = Path(__file__).resolve().parents[1] / "src" / "expertcache" / "data" / "example_trace"
BANDS = (Band(0, 8), Band(8, None))


def make_trace(cats: dict[str, bool], R: int = 16, T: int = 24, L: int = 4, N: int = 32, k: int = 4,
               seed: int = 0, prefill: int = 0) -> tuple[RoutingTrace, dict[str, str]]:
    """Categories whose requests route inside a per-layer subset of 8 experts (True) or anywhere (False).

    Tokens are random in [0, 10**6), so natural sequences never agree.
    """
    rng = np.random.default_rng(seed)
    ids, labels, ex, tok = [], {}, [], []
    for c, shared in cats.items():
        subset = np.stack([rng.choice(N, 8, replace=False) for _ in range(L)])
        for r in range(R):
            rid = f"{c}-{r:02d}"
            ids.append(rid)
            labels[rid] = c
            e = np.empty((prefill + T, L, k), np.int16)
            for t in range(prefill + T):
                for layer in range(L):
                    pool = subset[layer] if shared else np.arange(N)
                    e[t, layer] = rng.choice(pool, k, replace=False)
            ex.append(e)
            tok.append(rng.integers(0, 10 ** 6, prefill + T))
    n, rows = len(ids), prefill + T
    phase = np.tile(np.r_[np.full(prefill, PREFILL), np.full(T, DECODE)].astype(np.int8), n)
    tr = RoutingTrace(L, N, k, tuple(ids), np.repeat(np.arange(n, dtype=np.int32), rows), phase,
                      np.tile(np.arange(rows, dtype=np.int32), n), np.concatenate(ex), None,
                      np.concatenate(tok).astype(np.int64))
    return tr, labels


def test_locality_separates_the_sharing_category_only():
    tr, labels = make_trace({"shared": True, "plain": False, "other": False, "third": False})
    res = workload_locality(tr, labels, LocalityConfig(batch=4, rho=0.25, per_draw=6, seed=3))
    by = {c.category: c for c in res.categories}
    assert len(res.reference_miss_fractions) == 7 and res.reference_sd > 0
    assert by["shared"].verdict == "separated" and by["shared"].improvement > 0.5
    for c in ("plain", "other", "third"):
        assert by[c].verdict != "separated"
        assert by[c].interval_low < 0.05       # no positive effect beyond the reference's own spread
    assert "shared" in res.separated and "plain" not in res.separated
    assert res.statement().startswith("separated from the size-matched reference (6 requests per draw): shared;")


def test_locality_draws_are_disjoint_and_size_matched(monkeypatch):
    import expertcache.audit.locality as loc

    seen = []
    real = loc.stream_miss

    def spy(trace, requests, config, note):
        seen.append((note, np.sort(requests)))
        return real(trace, requests, config, note)

    monkeypatch.setattr(loc, "stream_miss", spy)
    tr, labels = make_trace({"a": True, "b": False, "c": False}, R=10, T=8)
    workload_locality(tr, labels, LocalityConfig(batch=2, per_draw=5, n_reference_draws=3))
    assert all(len(r) == 5 for _, r in seen)
    codes = {i: labels[r] for i, r in enumerate(tr.request_ids)}
    for _, r in seen[:3]:  # stratified: 5 over 3 categories -> 2/2/1
        assert sorted(np.bincount([ord(codes[i]) - 97 for i in r], minlength=3)) == [1, 2, 2]
    for c in range(3):
        d1, d2 = seen[3 + 2 * c][1], seen[4 + 2 * c][1]
        assert not set(d1) & set(d2)
    with pytest.raises(ValidationError, match=r"2 disjoint draws of 6 requests: 'a' has 10 \(2 missing\)"):
        workload_locality(tr, labels, LocalityConfig(batch=2, per_draw=6))


def naive_pair(tr: RoutingTrace, a: int, b: int) -> tuple[float, float]:
    ra = np.flatnonzero((tr.request == a) & (tr.phase == DECODE))
    rb = np.flatnonzero((tr.request == b) & (tr.phase == DECODE))
    n = min(len(ra), len(rb))
    agree = sum(tr.token_id[ra[t]] == tr.token_id[rb[t]] for t in range(n)) / n
    jac = np.mean([len(set(tr.experts[ra[t], l]) & set(tr.experts[rb[t], l]))
                   / len(set(tr.experts[ra[t], l]) | set(tr.experts[rb[t], l]))
                   for t in range(n) for l in range(tr.n_layers)])
    return agree, jac


def test_pair_stats_match_a_naive_twin():
    tr, _ = make_trace({"x": True, "y": False}, R=4, T=10, prefill=3, seed=5)
    # make some tokens agree, and one request shorter
    tokens = tr.token_id.copy()
    tokens[tr.request == 1] = tokens[tr.request == 0]
    tr = RoutingTrace(tr.n_layers, tr.n_experts, tr.top_k, tr.request_ids, tr.request, tr.phase, tr.position,
                      tr.experts, None, tokens)
    keep = ~((tr.request == 2) & (tr.position >= 10))
    short = RoutingTrace(tr.n_layers, tr.n_experts, tr.top_k, tr.request_ids, tr.request[keep], tr.phase[keep],
                         tr.position[keep], tr.experts[keep], None, tr.token_id[keep])
    pairs = list(itertools.combinations(range(short.n_requests), 2))
    a, b = np.array(pairs).T
    ps = pair_stats(decode_view(short), a, b, np.zeros(len(pairs), dtype=np.int64), 1)
    for i, (x, y) in enumerate(pairs):
        agree, jac = naive_pair(short, x, y)
        assert ps.agreement[i] == pytest.approx(agree) and ps.jaccard[i] == pytest.approx(jac)
    assert ps.agreement[pairs.index((0, 1))] == 1.0


def test_union_ratio_golden():
    # L=1, N=4, k=2; two requests of 2 decode tokens: t0 {0,1} & {1,2}; t1 {0,1} & {0,1}
    experts = np.array([[[0, 1]], [[0, 1]], [[1, 2]], [[0, 1]]], dtype=np.int16)
    tr = RoutingTrace(1, 4, 2, ("a", "b"), np.array([0, 0, 1, 1], np.int32), np.full(4, DECODE, np.int8),
                      np.array([0, 1, 0, 1], np.int32), experts, None, np.full(4, -1, np.int64))
    ratio = union_ratio_by_band(decode_view(tr), [np.array([0, 1])], (Band(0, 1), Band(1, None), Band(0, None)))
    assert ratio.tolist() == pytest.approx([3 / 4, 2 / 4, 5 / 8])


def test_injected_prefix_is_flagged_for_affected_categories_only():
    cats = {"A": False, "B": False, "C": False, "D": False}
    tr, labels = make_trace(cats, R=8, T=24, seed=1)
    cfg = RouteAuditConfig(bands=BANDS, cohort_size=4)
    natural = route_audit(tr, labels, cfg)
    assert natural.flag is False and natural.flagged_categories == ()
    assert all(c.unique_sequences == 8 and c.agreement_mean == 0 for c in natural.categories)
    injected = tr
    for c in ("A", "B"):
        members = [i for i, r in enumerate(tr.request_ids) if labels[r] == c]
        injected = inject_shared_prefix(injected, 8, source=members[0], requests=members)
    res = route_audit(injected, labels, cfg)
    by = {c.category: c for c in res.categories}
    assert res.flag is True and res.flagged_categories == ("A", "B")
    assert by["A"].prefix_bands == ("0-8",) and by["C"].prefix_bands == ()
    assert by["A"].band_agreement[0] == 1.0 and by["A"].agreement_mean == pytest.approx(8 / 24)
    assert by["A"].band_reduction[0] > 0.3 and abs(by["A"].band_reduction[1]) < 0.1
    # pairs that share the prefix are not low-text-overlap pairs: the restricted Jaccard has none in A
    assert by["A"].n_low_pairs == 0 and by["A"].jaccard_low is None and by["C"].n_low_pairs == 28
    assert injected.provenance["control"]["kind"] == "synthetic-positive"


def test_matched_attribution_measures_the_template_arm():
    tr, labels = make_trace({"A": False, "B": False}, R=16, T=24, seed=2)
    arms, source = {}, {}
    for i, r in enumerate(tr.request_ids):
        arms[r] = "fixed" if i % 16 >= 8 else "diverse"
        source[r] = f"{labels[r]}-{i % 8}"
    for c in ("A", "B"):   # the fixed rendering of category c echoes one shared prefix
        members = [i for i, r in enumerate(tr.request_ids) if labels[r] == c and arms[r] == "fixed"]
        tr = inject_shared_prefix(tr, 8, source=members[0], requests=members)
    res = matched_attribution(tr, labels, Arms(arms, source), RouteAuditConfig(bands=BANDS, cohort_size=4),
                              LocalityConfig(batch=4, rho=0.25))
    assert 0 < res.miss_fraction_fixed < res.miss_fraction_diverse < 1   # the echoed prefix is cached
    assert [r.category for r in res.rows] == ["A", "B"] and all(r.n_matched == 8 for r in res.rows)
    for r in res.rows:
        assert r.attributable[0] > 0.3 and abs(r.attributable[1]) < 0.1
    route = route_audit(tr, labels, RouteAuditConfig(bands=BANDS, cohort_size=4),
                        exclude=Arms(arms, source).fixed_mask(tr))
    assert route.flag is False and route.n_requests == 16


def test_positive_control_flips_on_the_bundled_example():
    tr = read_trace(EXAMPLE)
    labels = {r: f"c{i % 4}" for i, r in enumerate(tr.request_ids)}
    res = positive_control(tr, labels, 16)
    assert res.flipped and res.natural_unique_sequences == 64
    assert res.natural_agreement_mean == 0.0 and res.injected_agreement_mean == pytest.approx(16 / 80)
    assert res.injected_jaccard > res.natural_jaccard


def test_cli_audit_on_the_bundled_example(tmp_path):
    tr = read_trace(EXAMPLE)
    lab = tmp_path / "labels.csv"
    lab.write_text("request_id,category\n" + "".join(f"{r},cat{i % 4}\n" for i, r in enumerate(tr.request_ids)))
    out = tmp_path / "audit.json"
    res = CliRunner().invoke(main, ["audit", str(EXAMPLE), "--labels", str(lab), "--control", "16",
                                    "--reference-draws", "3", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert json.loads(out.read_text()) == data
    assert data["route"]["basis"] == "routes" and data["route"]["flag"] is False
    assert [c["category"] for c in data["route"]["categories"]] == ["cat0", "cat1", "cat2", "cat3"]
    assert data["control"]["flipped"] is True
    assert len(data["locality"]["reference_miss_fractions"]) == 3
    assert set(data["workload_block"]) >= {"unique_generated_sequences", "positional_token_agreement",
                                           "expert_jaccard_low_text_overlap"}
    assert data["workload_block"]["unique_generated_sequences"].startswith("64 / 64")
    res = CliRunner().invoke(main, ["audit", str(EXAMPLE), "--labels", str(lab), "-o", str(out)])
    assert res.exit_code == 2 and "already exists" in res.output


def test_cli_audit_errors(tmp_path):
    lab = tmp_path / "labels.csv"
    lab.write_text("request_id,category\nsynthetic-0000,a\n")
    res = CliRunner().invoke(main, ["audit", str(EXAMPLE), "--labels", str(lab)])
    assert res.exit_code == 2 and "63 of 64 requests have no category" in res.output
    res = CliRunner().invoke(main, ["audit", str(EXAMPLE), "--labels", str(lab), "--bands", "5:2"])
    assert res.exit_code == 2 and "0 <= START < STOP" in res.output
    assert "Traceback" not in res.output


def test_workload_block_fields():
    tr, labels = make_trace({"A": False, "B": False}, R=6, T=12, seed=4)
    block = workload_block(tr, labels, config=RouteAuditConfig(bands=BANDS, cohort_size=3))
    assert block["unique_generated_sequences"] == "12 / 12"
    assert block["decode_steps_recorded"] == "up to 12 (mean 12.0)"
    assert block["position_locked_cohorts"].startswith("yes")
    assert block["chat_template_applied"] == "not reported"
    assert block["positional_token_agreement"].startswith("0.00% mean per category")


def test_docs_python_example_runs(capsys, monkeypatch):
    import re

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    blocks = re.findall(r"```python\n(.*?)```", (root / "docs" / "probes.md").read_text(), flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/probes.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("False ") and out[1].startswith("separated from the size-matched reference")


def test_pair_sampling_is_seeded_and_reported():
    tr, labels = make_trace({"A": False, "B": False}, R=8, T=8, seed=6)
    cfg = RouteAuditConfig(bands=BANDS, cohort_size=4, max_pairs=10, seed=2)
    one, two = route_audit(tr, labels, cfg), route_audit(tr, labels, cfg)
    assert one.sampled and one.to_dict() == two.to_dict()
    assert [c.n_pairs for c in one.categories] == [10, 10] and one.n_cross_pairs == 10
    full = route_audit(tr, labels, RouteAuditConfig(bands=BANDS, cohort_size=4))
    assert not full.sampled and [c.n_pairs for c in full.categories] == [28, 28] and full.n_cross_pairs == 64


def _truncate(tr: RoutingTrace, lengths: dict[int, int]) -> RoutingTrace:
    """``tr`` with request ``r``'s decode cut to ``lengths[r]`` tokens (no prefill in these traces)."""
    cut = np.array([lengths.get(int(r), 10 ** 9) for r in tr.request])
    keep = tr.position < cut
    return RoutingTrace(tr.n_layers, tr.n_experts, tr.top_k, tr.request_ids, tr.request[keep], tr.phase[keep],
                        tr.position[keep], tr.experts[keep], None, tr.token_id[keep])


def naive_standardised_reduction(tr: RoutingTrace, homo: list[list[int]], mix: list[list[int]],
                                 band: range) -> float:
    """Union by active count from Python sets; 1 - sum U_h / sum S_h * (U_m / S_m) over shared a >= 2."""
    def by_active(cohorts):
        u, s = {}, {}
        for c in cohorts:
            rows = {r: np.flatnonzero(tr.request == r) for r in c}
            for t in band:
                act = [r for r in c if t < len(rows[r])]
                for layer in range(tr.n_layers):
                    if len(act) >= 2:
                        un = set().union(*(set(tr.experts[rows[r][t], layer].tolist()) for r in act))
                        u[len(act)] = u.get(len(act), 0) + len(un)
                        s[len(act)] = s.get(len(act), 0) + 1
        return u, s
    (uh, sh), (um, sm) = by_active(homo), by_active(mix)
    common = [a for a in sh if a in sm]
    return 1 - sum(uh[a] for a in common) / sum(sh[a] * um[a] / sm[a] for a in common)


def test_band_reduction_compares_at_equal_active_count():
    # no category routes differently; A answers long, B mostly short: before the mend A's late-band
    # "reduction" came from its cohorts keeping more members active than the mixture's
    tr, labels = make_trace({"A": False, "B": False}, R=16, T=24, seed=7)
    rng = np.random.default_rng(7)
    tr = _truncate(tr, {16 + i: int(x) for i, x in enumerate(rng.integers(4, 13, 16))})
    cfg = RouteAuditConfig(bands=BANDS, cohort_size=4)
    res = route_audit(tr, labels, cfg)
    a = next(c for c in res.categories if c.category == "A")
    assert abs(a.band_reduction[1]) < 0.03
    # the same numbers from Python sets, with the cohorts the audit used (same seeded orders)
    from expertcache.audit.bands import _chunks, band_reductions, round_robin

    view = decode_view(tr)
    orders = [np.arange(16), np.arange(16, 32)]
    red, _, size = band_reductions(view, orders, 4, BANDS)
    homo = [c.tolist() for c in _chunks(orders[0], size)]
    mix = [c.tolist() for c in _chunks(round_robin(orders), size)]
    assert red[0, 1] == pytest.approx(naive_standardised_reduction(tr, homo, mix, range(8, 24)))
    assert red[0, 0] == pytest.approx(naive_standardised_reduction(tr, homo, mix, range(0, 8)))
    # the plain ratio comparison (what the audit reported before) shows a length-made effect
    plain = 1 - union_ratio_by_band(view, [np.array(c) for c in homo], BANDS) / \
        union_ratio_by_band(view, [np.array(c) for c in mix], BANDS)
    assert plain[1] > 0.1


def test_stable_needs_two_measured_bands():
    from expertcache.audit.routes import _flag

    cfg = RouteAuditConfig(bands=BANDS)
    assert _flag([0.0, 0.0], [0.02, None], ("0-8", "8-"), cfg) == ((), False, False)
    assert _flag([0.0, 0.0], [0.02, 0.03], ("0-8", "8-"), cfg) == ((), False, True)


def test_locality_verdict_is_a_pooled_t_test():
    from scipy import stats

    from expertcache.audit.locality import compare_draws, student_t_sf

    ref = [0.24, 0.21, 0.27, 0.25, 0.22, 0.26, 0.23]
    for cat in ([0.19, 0.18], [0.22], [0.30, 0.31, 0.29], [0.235, 0.245]):
        res = compare_draws(ref, cat, alpha=0.05)
        want = stats.ttest_ind(ref, cat, equal_var=True)
        assert res.t == pytest.approx(want.statistic) and res.p_value == pytest.approx(want.pvalue)
        assert res.df == len(ref) + len(cat) - 2
        assert res.verdict == ("not distinguishable from zero" if want.pvalue >= 0.05 else
                               "separated" if want.statistic > 0 else "below reference")
    for t, df in ((0.3, 1), (2.0, 7), (-1.5, 3), (4.2, 30)):
        assert student_t_sf(t, df) == pytest.approx(stats.t.sf(t, df), rel=1e-9)


@pytest.mark.parametrize("n_ref,n_cat", [(2, 1), (3, 2), (7, 2)])
def test_locality_verdict_error_rate_under_the_null(n_ref, n_cat):
    # Gaussian draws of one distribution: "separated" should fire alpha/2 of the time at any draw count
    # (the previous |z| >= 2 rule fired 17% at 2 and 1 draws, 0.8% at 7 and 2)
    from expertcache.audit.locality import compare_draws

    rng = np.random.default_rng(n_ref * 10 + n_cat)
    hits = sum(compare_draws(rng.normal(0.2, 0.02, n_ref), rng.normal(0.2, 0.02, n_cat)).verdict == "separated"
               for _ in range(4000))
    assert 0.015 < hits / 4000 < 0.035


def test_locality_names_only_the_short_categories():
    tr, labels = make_trace({"a": False, "b": False}, R=6, T=4)
    labels = {r: ("lone" if i == 0 else c) for i, (r, c) in enumerate(labels.items())}
    with pytest.raises(ValidationError) as err:     # default per_draw: min(12, 1 // 2) = 0 -> draws of 1
        workload_locality(tr, labels, LocalityConfig(batch=2))
    assert "2 disjoint draws of 1 requests: 'lone' has 1 (1 missing); label more" in str(err.value)
    assert "'a'" not in str(err.value) and "'b'" not in str(err.value)
    with pytest.raises(ValidationError, match="got 1: label the requests with categories, or skip it"):
        workload_locality(tr, {r: "all" for r in tr.request_ids}, LocalityConfig(batch=2))


def test_cli_audit_refuses_an_unwritable_output_before_work(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    res = CliRunner().invoke(main, ["audit", str(EXAMPLE), "--no-locality", "-o", str(afile / "out.json")])
    assert res.exit_code == 2 and "not a directory" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["audit", str(EXAMPLE), "--no-locality", "-o", str(tmp_path), "--overwrite"])
    assert res.exit_code == 2 and "is a directory" in res.output


def test_a_single_request_category_does_not_void_every_decay_measurement():
    tr, labels = make_trace({"A": True, "B": False}, R=8, T=16, seed=8)
    labels = dict(labels)
    labels[tr.request_ids[-1]] = "lone"
    res = route_audit(tr, labels, RouteAuditConfig(bands=BANDS, cohort_size=4))
    by = {c.category: c for c in res.categories}
    assert res.cohort_size == 4
    assert all(x is not None for x in by["A"].band_reduction + by["B"].band_reduction)
    assert by["A"].band_reduction[0] > 0.2 and by["lone"].band_reduction == (None, None)


def test_cli_audit_category_draws_and_alpha():
    model = EXAMPLE.parent / "example_model_trace"
    res = CliRunner().invoke(main, ["audit", str(model), "--category-draws", "3", "--alpha", "0.1",
                                    "--reference-draws", "3", "--json"])
    assert res.exit_code == 0, res.output
    loc = json.loads(res.output)["locality"]
    assert loc["per_draw"] == 4 and loc["config"]["alpha"] == 0.1      # 14 per category // 3 draws
    assert all(len(c["miss_fractions"]) == 3 and c["df"] == 4 for c in loc["categories"])
    assert all((c["verdict"] == "not distinguishable from zero") == (c["p_value"] >= 0.1)
               for c in loc["categories"])


def test_cli_audit_without_the_fixed_arm_skips_matched_pairs(tmp_path):
    model = EXAMPLE.parent / "example_model_trace"
    tr = read_trace(model)
    cats = tr.provenance["categories"]
    lab = tmp_path / "labels.csv"   # a probe set's labels whose fixed arm was not collected
    lab.write_text("request_id,category,arm,source_id\n" + "".join(
        f"{r},{cats[r]},diverse,s{i}\n" for i, r in enumerate(tr.request_ids)) + "gone-fixed,code,fixed,s0\n")
    res = CliRunner().invoke(main, ["audit", str(model), "--labels", str(lab), "--no-locality", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert "matched" not in data and "fixed arm" in data["matched_note"] and data["route"]["n_requests"] == 56


def test_cli_audit_says_why_a_directory_is_not_a_trace(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text("{garbage")
    res = CliRunner().invoke(main, ["audit", str(bad)])
    assert res.exit_code == 2 and "not valid JSON" in res.output and "probes.jsonl" not in res.output
    (bad / "manifest.json").write_text('{"kind": "event_stream"}')
    res = CliRunner().invoke(main, ["audit", str(bad)])
    assert res.exit_code == 2 and "expected a routing trace directory" in res.output


def test_reference_draws_are_mixed_throughout(monkeypatch):
    # categories are listed in blocks (as a probe set writes them); a reference draw streamed in input
    # order would admit one category's requests together
    import expertcache.audit.locality as loc

    seen = []
    real = loc.stream_miss

    def spy(trace, requests, config, note):
        seen.append((note, [trace.request_ids[int(i)][0] for i in requests]))
        return real(trace, requests, config, note)

    monkeypatch.setattr(loc, "stream_miss", spy)
    tr, labels = make_trace({"a": False, "b": False, "c": False}, R=12, T=6)
    workload_locality(tr, labels, LocalityConfig(batch=3, per_draw=6, n_reference_draws=3))
    refs = [cats for note, cats in seen if "reference" in note]
    assert len(refs) == 3
    for cats in refs:
        assert sorted(cats) == ["a", "a", "b", "b", "c", "c"]
        assert len(set(cats[:3])) == 3 and len(set(cats[3:])) == 3      # every batch of 3 holds all three


def test_decode_view_leaves_the_trace_alone():
    tr, _ = make_trace({"A": False}, R=3, T=5, prefill=2)
    before = tr.experts.copy()
    view = decode_view(tr)
    assert (tr.experts == before).all()
    dec = tr.phase == DECODE
    assert view.experts.shape[0] == int(dec.sum()) and (np.diff(view.experts, axis=2) > 0).all()
    assert (np.sort(tr.experts[dec], axis=2) == view.experts).all() and view.first.tolist() == [0, 5, 10]
