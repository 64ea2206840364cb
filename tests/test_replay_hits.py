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
