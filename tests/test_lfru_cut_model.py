"""``benchmarks/lfru_cut_model.py``: the model of per-layer lfru's cuts, on hand-derived cases."""

from __future__ import annotations

import numpy as np
from conftest import load_script

from expertcache.events import EventStream


def _model():
    return load_script("benchmarks/lfru_cut_model.py", "bench_lfru_cut_model")


KEYS = np.arange(1.0, 11.0)          # C ∪ U of ten blocks, keys 1 .. 10


def test_cuts_that_hold_the_need_th_key_rank_the_band_between_them():
    # m = 5, last need-th key 5: cuts 4.25 (4 below) and 6 (6 below): need 1 of a band of 2, no move
    moved, shares = _model().rule([(0, KEYS, 5, 5.0)], 0.85, 1.2, 1.5)
    assert moved == 0
    assert shares.tolist() == [0, 1, 0, 0, 0]


def test_a_low_cut_holding_too_many_becomes_the_high_cut_and_the_low_one_steps_down():
    # last need-th key 10: cuts 8.5 (8 below, more than m = 5) and 12. The low cut becomes the high cut (8 below)
    # and the new low cut is 8.5 / first: 5.67 holds 5 (none to rank) where 8.5 / 4 = 2.125 holds 2 (need 3 of
    # a band of 6)
    m = _model()
    moved, shares = m.rule([(0, KEYS, 5, 10.0)], 0.85, 1.2, 1.5)
    assert moved == 1 and shares.tolist() == [1, 0, 0, 0, 0]
    moved, shares = m.rule([(0, KEYS, 5, 10.0)], 0.85, 1.2, 4.0)
    assert moved == 1 and shares.tolist() == [0, 1, 0, 0, 0]


def test_each_further_step_squares_the_factor():
    # last need-th key 40 over keys 1 .. 10, m = 2: low cuts 34, 34 / 1.5 = 22.7, / 2.25 = 10.07, / 5.06 = 1.99:
    # three moves, and the last holds 1 block, the band (1.99, 10.07] 9 (keys 2 .. 10) with need 1
    moved, shares = _model().rule([(0, KEYS, 2, 40.0)], 0.85, 1.2, 1.5)
    assert moved == 3
    assert shares.tolist() == [0, 0, 1, 0, 0]


def test_the_next_cuts_follow_the_rules_own_need_th_key_or_its_low_cut():
    # two overflows of one layer: the first ends with no key of the band leaving (low cut 5.67 holds m = 5), so
    # the second's cuts follow 5.67 (4.82: 5 below, m = 5, none to rank), not the need-th key 5 (cuts 4.25 and
    # 6: need 1 of a band of 2) nor the recorded 100
    keys2 = np.array([1, 2, 3, 4, 4.5, 5.5, 6.5, 7, 8, 9])
    moved, shares = _model().rule([(0, KEYS, 5, 10.0), (0, keys2, 5, 100.0)], 0.85, 1.2, 1.5)
    assert moved == 0.5
    assert shares.tolist() == [1, 0, 0, 0, 0]


def test_overflows_are_those_of_lfru_per_layer_by_hand():
    # one layer of 4 experts, quota round(0.5 * 4) = 2, one event per unit (the clock is the event index):
    # e0 {0, 1, 2}: counts 1, 1, 1, keys 1, 1, 1, m = 1, the lowest by expert id leaves (0); need-th key 1
    # e1 {3}: C ∪ U = {1, 2, 3}, keys 1/2, 1/2, 1, m = 1: the recorded one, after the first, with last key 1
    s = EventStream.from_lists(1, 4, 3, [0, 1], [0, 0], [np.array([0, 1, 2]), np.array([3])], [1, 1])
    # (e0 has 3 members, more than the quota: regime 1; e1 has 1: regime 0)
    recs = _model().overflows(s, 0.5, skip=0)
    assert len(recs) == 1
    layer, keys, m, last, regime = recs[0]
    assert layer == 0 and m == 1 and last == 1.0 and regime == 0
    assert keys.tolist() == [0.5, 0.5, 1.0]


def test_cuts_per_regime_follow_the_last_need_th_key_of_their_own_regime():
    # three overflows of one layer, m = 5 each, recorded last need-th key 5. Regime 1 (keys 1 .. 10): cuts 4.25 /
    # 6 hold 4 / 6, no move, need 1 of a band of 2; its need-th key 5. Regime 0 between (keys ten times lower):
    # from 5, the low cut 4.25 holds all 10, and moves to 4.25 / 1.5 = 2.83 (10), / 2.25 = 1.26 (10), / 5.06 =
    # 0.249 (2): 3 moves; its need-th key 0.5. The third (regime 1 again) with one pair starts from 0.5: cuts
    # 0.425 / 0.6 hold none, the high cut moves to 0.9 (0), 2.03 (2), 10.25 (10): 3 moves; with a pair per regime
    # it starts from its own 5: none. Every band holds at most 8
    low = KEYS / 10.0
    recs = [(0, KEYS, 5, 5.0, 1), (0, low, 5, 5.0, 0), (0, KEYS, 5, 5.0, 1)]
    m = _model()
    moved, shares = m.rule(recs, 0.85, 1.2, 1.5)
    assert moved * 3 == 6 and shares.tolist() == [0, 1, 0, 0, 0]
    moved, shares = m.rule(recs, 0.85, 1.2, 1.5, per_regime=True)
    assert moved * 3 == 3 and shares.tolist() == [0, 1, 0, 0, 0]
