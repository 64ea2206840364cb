"""Next-use features, predictors and advice-driven replay (§7.3)."""

from __future__ import annotations

import numpy as np
import pytest
from test_twin_large import random_stream

from expertcache.errors import ValidationError
from expertcache.events import build_events
from expertcache.nextuse import (
    Advice,
    GradientBoostedNextUse,
    LinearNextUse,
    access_features,
    advice_from_predictions,
    load_predictor,
    oracle_advice,
    transfer_r2,
)
from expertcache.replay import ReplayConfig, replay
from expertcache.trace import select_requests
from expertcache.trace.examples import example_trace


@pytest.fixture(scope="module")
def splits():
    tr = example_trace()
    idx = np.arange(tr.n_requests)
    return build_events(select_requests(tr, idx[0::2]), 8), build_events(select_requests(tr, idx[1::2]), 8)


def test_features_by_hand():
    from expertcache.events import EventStream

    # layer 0: events 0 {1,2}, 1 {2}, 2 {1,2}; block 2 is accessed at units 0, 1, 2
    s = EventStream.from_lists(1, 4, 2, [0, 1, 2], [0, 0, 0], [[1, 2], [2, 3], [1, 2]], [1, 1, 1])
    f = access_features(s)
    # accesses: (u0,e1) (u0,e2) (u1,e2) (u1,e3) (u2,e1) (u2,e2)
    assert f.X[:, 1].tolist() == [1, 1, 0, 1, 0, 0]                      # first observation
    assert np.allclose(f.X[:, 0], np.log1p([0, 0, 1, 0, 2, 1]))          # recency
    assert np.allclose(f.X[:, 2], np.log1p([0, 0, 1, 0, 1, 2]))          # previous accesses
    assert np.allclose(f.X[:, 3], np.log1p([0, 0, 0, 0, 0, 1]))          # previous gap
    assert np.allclose(f.X[:, 7], [0, 0, 1.0, 0, 0.5, 1.0])              # accesses / prior layer events
    assert f.never_again.tolist() == [False, False, False, True, True, True]
    assert np.allclose(f.log_next_distance[:3], np.log([2, 1, 1]))
    assert np.isnan(f.log_next_distance[3:]).all()                     # never again: NaN, not a distance


@pytest.mark.parametrize("scope", ["per-layer", "global"])
def test_perfect_predictor_reproduces_belady_exactly(splits, scope):
    _, held = splits
    adv = oracle_advice(access_features(held))
    for rho in (0.1, 0.4):
        a = replay(held, ReplayConfig("predicted-next-use", rho=rho, scope=scope), advice=adv)
        b = replay(held, ReplayConfig("belady", rho=rho, scope=scope))
        assert (a.transferred, [x.hits for x in a.per_layer]) == (b.transferred, [x.hits for x in b.per_layer])


def test_linear_and_boosted_predictors_transfer_and_round_trip(splits, tmp_path):
    pytest.importorskip("sklearn")
    calib, held = splits
    fc, fh = access_features(calib), access_features(held)
    lin = LinearNextUse.fit(fc)
    gbt = GradientBoostedNextUse.fit(fc, n_estimators=30, max_rows=20_000)
    for model, name in ((lin, "m.json"), (gbt, "m.npz")):
        r2 = transfer_r2(model, fh)
        assert -1.0 < r2 < 1.0
        back = load_predictor(model.save(tmp_path / name))
        assert np.allclose(back.predict(fh.X[:500]), model.predict(fh.X[:500]))
    # the numpy tree evaluator equals scikit-learn's own prediction
    from sklearn.ensemble import GradientBoostingRegressor

    ok = ~fc.never_again
    X, y = fc.X[ok][:5000], fc.log_next_distance[ok][:5000]
    sk = GradientBoostingRegressor(n_estimators=10, max_depth=3, subsample=0.8, random_state=0).fit(X, y)
    mine = GradientBoostedNextUse.fit(type(fc)(X, y, np.zeros(len(y), bool), fc.unit[ok][:5000],
                                               fc.next_unit[ok][:5000]), n_estimators=10, max_rows=None)
    assert np.allclose(mine.predict(fh.X[:2000]), sk.predict(fh.X[:2000]))


def test_predicted_policy_runs_through_advice(splits):
    calib, held = splits
    lin = LinearNextUse.fit(access_features(calib))
    fh = access_features(held)
    adv = advice_from_predictions(fh, lin.predict(fh.X), {"predictor": "linear"})
    res = replay(held, ReplayConfig("predicted-next-use"), advice=adv)
    belady = replay(held, ReplayConfig("belady"))
    assert res.transferred >= belady.transferred
    assert res.hits + res.demand_misses == held.union


def test_advice_is_validated():
    s = random_stream(1)
    with pytest.raises(ValidationError, match="needs advice"):
        replay(s, ReplayConfig("predicted-next-use"))
    bad = Advice(np.zeros(s.union, dtype=np.int32))
    with pytest.raises(ValidationError, match="after the access"):
        replay(s, ReplayConfig("predicted-next-use"), advice=bad)
    good = oracle_advice(access_features(s))
    with pytest.raises(ValidationError, match="event-atomic"):
        replay(s, ReplayConfig("predicted-next-use", semantics="sequential-ascending"), advice=good)


def test_load_predictor_rejects_foreign_files(tmp_path):
    (tmp_path / "x.json").write_text('{"kind": "other"}')
    with pytest.raises(ValidationError):
        load_predictor(tmp_path / "x.json")
    np.save(tmp_path / "y.npy", np.array([1, 2]))
    with pytest.raises(ValidationError):
        load_predictor(tmp_path / "y.npy")


def test_nextuse_commands(splits, tmp_path):
    import json

    from click.testing import CliRunner

    from expertcache.cli import main

    calib, held = splits
    calib.save(tmp_path / "c")
    held.save(tmp_path / "h")
    run = CliRunner().invoke
    res = run(main, ["nextuse", "fit", str(tmp_path / "c"), "-o", str(tmp_path / "m.json")])
    assert res.exit_code == 0, res.output
    res = run(main, ["nextuse", "eval", str(tmp_path / "m.json"), str(tmp_path / "h"), "--advice-out",
                     str(tmp_path / "a.npz"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out["miss_fraction"]) >= {"predicted_next_use", "belady", "lfu"}   # --json keys are snake_case
    res = run(main, ["replay", str(tmp_path / "h"), "--policy", "predicted-next-use", "--advice",
                     str(tmp_path / "a.npz"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["miss_fraction"] == pytest.approx(out["miss_fraction"]["predicted_next_use"])
    res = run(main, ["replay", str(tmp_path / "h"), "--policy", "predicted-next-use"])
    assert res.exit_code == 2 and "needs advice" in res.output
    res = run(main, ["nextuse", "fit", str(tmp_path / "c"), "-o", str(tmp_path / "m.npz")])
    assert res.exit_code == 2 and ".json" in res.output


def _constructed(never_tail: bool):
    from expertcache.events import EventStream

    # 1 layer x 5 experts, capacity 3 (rho 0.6): e0 fills {0,1,2}; e1 brings 3 -> the first eviction decision
    # has candidates {0,1,2,3}. Next uses afterwards: 0 at e2, 1 at e3, then either 2 at e4 and 3 at e5
    # (distinct: a unique optimal victim, 3) or nothing more (2 and 3 never again: a tied optimal set {2,3}).
    events = [[0, 1, 2], [3], [0], [1]] + ([] if never_tail else [[2], [3]])
    n = len(events)
    return EventStream.from_lists(1, 5, 1, list(range(n)), [0] * n, events, [3] + [1] * (n - 1))


@pytest.mark.parametrize("never_tail, opt_size", [(False, 1), (True, 2)])
def test_optimal_victim_set_is_tie_aware_and_random_scores_its_share(never_tail, opt_size):
    from expertcache.nextuse.victims import record_decisions, score_decisions

    s = _constructed(never_tail)
    dec = record_decisions(s, oracle_advice(access_features(s)), rho=0.6, every=1, candidates="residents+misses")
    assert dec.length[0] == 4                                        # residents {0,1,2} + the miss 3
    rep = score_decisions(dec, n_boot=50)
    first_opt = opt_size
    assert rep.mean_optimal_set >= 1
    # at the first decision: random picks inside the optimal set with probability |opt| / |candidates|
    from expertcache.nextuse import victims as V

    one = V.VictimDecisions(dec.n_units, dec.unit[:1], dec.step[:1], dec.start[:1], dec.length[:1], dec.choice[:1],
                            dec.block, dec.true_next, dec.pred_next, dec.last, dec.freq, dec.tie, dec.candidates)
    r1 = score_decisions(one, n_boot=10)
    assert r1.mean_optimal_set == first_opt
    assert r1.in_optimal_set["random candidate"][0] == pytest.approx(first_opt / 4)
    assert r1.in_optimal_set["predicted next use"][0] == 1.0       # the perfect predictor


def test_candidate_set_is_the_residents_by_default(splits):
    """§7.3: a decision ranks the resident blocks, so the mean candidate set is at most the per-layer capacity."""
    from expertcache.nextuse.victims import record_decisions, score_decisions
    from expertcache.replay import capacities_for_rho

    _, held = splits
    adv = oracle_advice(access_features(held))
    caps = capacities_for_rho(0.4, held.n_layers, held.n_experts)
    dec = record_decisions(held, adv, every=5)
    assert dec.candidates == "residents" and dec.unit.size > 50
    assert (dec.length <= caps[held.layer[dec.unit]]).all()
    both = record_decisions(held, adv, every=5, candidates="residents+misses")
    assert both.length.mean() > caps.mean() >= dec.length.mean()
    assert score_decisions(dec, n_boot=10).candidates == "residents"


def test_perfect_predictor_scores_100_percent_on_real_decisions(splits):
    from expertcache.nextuse.victims import record_decisions, score_decisions

    _, held = splits
    rep = score_decisions(record_decisions(held, oracle_advice(access_features(held)), every=11), n_boot=100)
    assert rep.n_decisions > 100
    assert rep.in_optimal_set["predicted next use"] == (1.0, 1.0, 1.0)
    assert rep.distance_regret["predicted next use"][0] == 0.0
    lo, hi = rep.in_optimal_set["random candidate"][1:]
    assert lo <= rep.in_optimal_set["random candidate"][0] <= hi


def test_cluster_bootstrap_contains_the_estimate_and_shrinks():
    from expertcache.nextuse.victims import cluster_bootstrap

    rng = np.random.default_rng(0)
    widths = []
    for n_clusters in (20, 500):
        clusters = np.repeat(np.arange(n_clusters), 10)
        values = rng.normal(size=n_clusters)[clusters] + rng.normal(size=clusters.size)
        mean, lo, hi = cluster_bootstrap(values, clusters, n_boot=500, seed=1)
        assert lo <= mean <= hi
        widths.append(hi - lo)
    assert widths[1] < widths[0] / 2


def test_victims_command(splits, tmp_path):
    import json

    from click.testing import CliRunner

    from expertcache.cli import main

    calib, held = splits
    calib.save(tmp_path / "c")
    held.save(tmp_path / "h")
    run = CliRunner().invoke
    assert run(main, ["nextuse", "fit", str(tmp_path / "c"), "-o", str(tmp_path / "m.json")]).exit_code == 0
    res = run(main, ["nextuse", "victims", str(tmp_path / "m.json"), str(tmp_path / "h"), "--every", "13",
                     "--bootstrap", "100", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out["in_optimal_set"]) == {"random candidate", "predicted next use", "LRU", "LFRU"}
    for m, lo, hi in out["in_optimal_set"].values():
        assert lo <= m <= hi


def test_linear_fit_and_r2_equal_their_plain_formulas(splits):
    """The fit's sample (rows with a next use, then a seeded sample of them, copied once) and the in-sample R²
    (rows standardised in place) give exactly the plain expressions' values, and ``predict`` leaves its input
    as it was. Both take the rows :data:`PREDICT_ROWS` at a time (three chunks here, the last partial): each
    row's product with the coefficients is the bits of one product over every row."""
    from expertcache.nextuse.predictors import PREDICT_ROWS, _fit_rows

    f = access_features(splits[0])
    assert (~f.never_again).sum() > 2 * PREDICT_ROWS and f.X.shape[0] % PREDICT_ROWS
    ok = ~f.never_again
    X, y = _fit_rows(f, 50, 3)
    idx = np.sort(np.random.default_rng(3).choice(int(ok.sum()), size=50, replace=False))
    assert np.array_equal(X, f.X[ok][idx]) and np.array_equal(y, f.log_next_distance[ok][idx])
    model = LinearNextUse.fit(f)
    before = f.X.copy()
    pred = model.predict(f.X)
    assert np.array_equal(f.X, before)
    assert np.array_equal(pred, ((before - model.mean) / model.scale) @ model.coef + model.intercept)
    yy, pp = f.log_next_distance[ok], pred[ok]
    assert transfer_r2(model, f) == float(1.0 - ((yy - pp) ** 2).sum() / ((yy - yy.mean()) ** 2).sum())


def test_features_equal_a_plain_loop_on_random_streams():
    """Every feature of every access against a Python loop over the definitions (logarithms of gaps, counts and
    multiplicities from the kernel's tables must be those of the calls)."""
    stream = random_stream(4, 3, 9, 3, 60)
    f = access_features(stream)
    last, gap, count, events = {}, {}, {}, {}
    for i in range(stream.n_events):
        layer = int(stream.layer[i])
        for a in range(int(stream.offsets[i]), int(stream.offsets[i + 1])):
            b = (layer, int(stream.expert[a]))
            seen = b in last
            want = [np.log1p(i - last[b]) if seen else 0.0, 0.0 if seen else 1.0, np.log1p(count.get(b, 0)),
                    np.log1p(gap.get(b, 0)), 0.0 if stream.gate_mass is None else float(stream.gate_mass[a]),
                    np.log(max(int(stream.multiplicity[a]), 1)), layer,
                    count.get(b, 0) / events[layer] if events.get(layer) else 0.0]
            np.testing.assert_allclose(f.X[a], want, rtol=1e-15, atol=0, err_msg=str((i, a)))
            if seen:
                gap[b] = i - last[b]
            last[b] = i
            count[b] = count.get(b, 0) + 1
        events[layer] = events.get(layer, 0) + 1


def test_boosted_predictions_by_chunks_equal_one_walk_over_every_row(splits):
    """The trees' prediction, taken :data:`PREDICT_ROWS` rows at a time (three chunks here, the last partial), and
    its R² equal one walk over every row and the plain expression exactly."""
    pytest.importorskip("sklearn")
    from expertcache.nextuse.predictors import PREDICT_ROWS

    calib, held = splits
    f = access_features(held)
    assert f.X.shape[0] > 2 * PREDICT_ROWS and f.X.shape[0] % PREDICT_ROWS
    model = GradientBoostedNextUse.fit(access_features(calib), n_estimators=8, max_rows=5000)
    whole = model._predict(f.X)
    assert np.array_equal(model.predict(f.X), whole)
    ok = ~f.never_again
    yy, pp = f.log_next_distance[ok], whole[ok]
    assert transfer_r2(model, f) == float(1.0 - ((yy - pp) ** 2).sum() / ((yy - yy.mean()) ** 2).sum())


def test_advice_from_predictions_equals_its_plain_expression():
    """Each step taken in place on one array gives the plain expression's advice, for predictions that are NaN,
    infinite, negative, past the clip or near the int32 bound, and leaves the predictions as they were."""
    from expertcache.nextuse.features import AccessFeatures
    from expertcache.replay import _kernels as K

    rng = np.random.default_rng(0)
    n = 5000
    unit = np.sort(rng.integers(0, 2**31 - 10, n))
    x = rng.normal(0.0, 20.0, n)
    x[::97], x[::89], x[::83], x[::79], x[::71] = np.nan, np.inf, -np.inf, 41.0, -0.0
    before = x.copy()
    f = AccessFeatures(np.zeros((n, 8)), np.zeros(n), np.zeros(n, bool), unit, np.zeros(n, np.int32))
    with np.errstate(invalid="ignore"):            # (NaN cast to an integer, both sides)
        got = advice_from_predictions(f, x).next_use
        dist = np.maximum(1.0, np.rint(np.exp(np.clip(x, 0.0, 40.0))))
        want = np.minimum(unit + dist, float(K.NEVER)).astype(np.int64).astype(np.int32)
    assert got.dtype == np.int32 and np.array_equal(got, want)
    assert np.array_equal(x, before, equal_nan=True)
