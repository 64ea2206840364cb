"""Per-access hit flags (``replay_hits``): the hit blocks of every unit equal the naive twin's, for every policy."""

from __future__ import annotations

import numpy as np
import pytest
from naive import naive_replay

from expertcache.errors import ValidationError
from expertcache.events import build_events
from expertcache.replay import ReplayConfig, policy_names, replay, replay_hits
from expertcache.trace.synth import SynthConfig, synthesize_trace

POLICIES = [p for p in policy_names(advice=False) if p != "static"] + ["static"]


def _stream(seed: int, batch: int = 3):
    tr = synthesize_trace(SynthConfig(n_layers=2, n_experts=12, top_k=3, n_requests=6, decode_tokens=12,
                                      prefill_tokens=2, seed=seed))
    return build_events(tr, batch)


@pytest.mark.parametrize("semantics", ["event-atomic", "sequential-ascending"])
@pytest.mark.parametrize("scope", ["per-layer", "global"])
@pytest.mark.parametrize("policy", POLICIES)
def test_flags_name_the_twins_hit_blocks_unit_by_unit(policy, scope, semantics):
    stream, calib = _stream(1), _stream(2)
    cfg = ReplayConfig(policy, rho=0.3, scope=scope, semantics=semantics, tie_break="random", seed=5,
                       warmup_events=3)
    result, hit = replay_hits(stream, cfg, calibration=calib)
    want: list[set[int]] = []
    naive_replay(stream, policy, rho=0.3, scope=scope, semantics=semantics, seed=5, calibration=calib,
                 warmup_events=3, hit_sets=want)
    blocks = np.repeat(stream.layer.astype(np.int64), np.diff(stream.offsets)) * stream.n_experts + stream.expert
    if semantics == "event-atomic":
        got = [set(blocks[lo:hi][hit[lo:hi]].tolist()) for lo, hi in zip(stream.offsets[:-1], stream.offsets[1:], strict=True)]
    else:
        got = [{int(b)} if h else set() for b, h in zip(blocks, hit, strict=True)]
    assert got == want
    counted = np.repeat(np.arange(stream.n_events) >= 3, np.diff(stream.offsets))
    assert int(hit[counted].sum()) == result.hits
    assert result == replay(stream, cfg, calibration=calib)


def test_sequential_random_is_refused():
    with pytest.raises(ValidationError, match="member order"):
        replay_hits(_stream(1), ReplayConfig("lru", semantics="sequential-random"))


@pytest.mark.parametrize("policy", ["lru", "lfru", "static", "belady"])
def test_per_step_misses_equal_the_difference_of_warmup_replays(policy):
    """The miss-burst series from one flagged replay equals its definition by counting from each step's first
    event on (one replay per step): T(start of s) - T(start of s + 1)."""
    from dataclasses import replace

    from expertcache.experiment.scoped import per_step_transferred

    stream, calib = _stream(3, batch=2), _stream(4)
    cfg = ReplayConfig(policy, rho=0.3, seed=2)
    _, starts = np.unique(stream.step, return_index=True)
    tail = [replay(stream, replace(cfg, warmup_events=int(e)), calibration=calib).demand_misses for e in starts]
    want = np.array(tail, dtype=np.int64) - np.array(tail[1:] + [0], dtype=np.int64)
    assert per_step_transferred(stream, cfg, calib).tolist() == want.tolist()
