"""Prefetches on the timeline: a proactive replay's loads issued at their decision availability (docs/timing.md).

The proactive replay (:func:`expertcache.replay.proactive.replay_proactive_hits`) decides, before every event,
which blocks pre-access refinement inserts, and which accesses then hit; the timing model issues each event's
prefetches on the link at the moment its decision is available and lets them share the channels with the
demand misses, in issue order:

* ``prev-layer`` (CLR's Spatio Router, ``Prev. layer`` baselines): when the preceding MoE layer's routing is
  known, i.e. event ``i - 1``'s (for the first layer of a step, the last layer of the previous step: CLR's
  predecessor ``rho``), after that event's own misses;
* ``prev-layer:D`` (a lookahead predictor ``l - D -> l``, ProMoE style): when event ``i - D``'s routing is known;
* ``prev-token`` (``Prev. token`` baselines, option sets): when the previous forward step ends.

A prefetch still in flight when its expert is to compute stalls the compute unit for the remainder (*late*); one
that has landed is *timely*; one never hit before it leaves the cache is *useless* (the replay's wasted
prefetches). A prefetch that evicts a block needed sooner shows as that block's demand miss: the replay's count.
Transfer and hit counts are the replay's by construction.
"""

from __future__ import annotations

import numpy as np

from ..errors import ValidationError
from ..events import EventStream
from ..replay.proactive import ProactiveConfig, replay_proactive_hits
from . import _kernels as K
from .model import TimingResult, build_result, layer_tokens, recorded_expert_bytes
from .profile import HardwareProfile

__all__ = ["ISSUES", "issue_lead", "issue_for_availability", "simulate_prefetch"]

#: Issue points of prefetches (``prev-layer:D`` takes any ``1 <= D < L``).
ISSUES = ("prev-layer", "prev-token")


def issue_lead(issue: str, n_layers: int) -> int:
    """The kernel's ``lead`` of an issue point: ``D >= 1`` events back, or 0 for the previous step's end.

    >>> issue_lead("prev-layer", 4), issue_lead("prev-layer:3", 4), issue_lead("prev-token", 4)
    (1, 3, 0)
    """
    if issue == "prev-token":
        return 0
    head, sep, tail = issue.partition(":")
    if head == "prev-layer":
        try:
            d = int(tail) if sep else 1
        except ValueError:
            d = -1
        if 1 <= d < n_layers:
            return d
        raise ValidationError(f"issue {issue!r}: the layer distance must be an integer in [1, {n_layers - 1}] "
                              f"(fewer than the stream's {n_layers} MoE layers, so a prefetch never replaces a "
                              "block its own layer is still computing with); use prev-token otherwise",
                              field="issue")
    raise ValidationError(f"issue must be prev-layer, prev-layer:D or prev-token; got {issue!r}", field="issue")


def issue_for_availability(availability: str) -> str | None:
    """The issue point of a baseline's decision availability (``expertcache prefetch compare``'s column).

    ``None`` for update-only rows (``Curr. layer``: nothing is prefetched). Option sets (``option start``, the
    oracle one too) are reloaded when the previous step ends; the next-true oracle has no causal availability
    and is issued at the previous layer, like the earliest causal predictor.

    >>> issue_for_availability("Prev. layer (l-3)"), issue_for_availability("Prev. token")
    ('prev-layer:3', 'prev-token')
    """
    text = availability.strip()
    if text.startswith("Curr. layer"):
        return None
    if text.startswith("Prev. token") or text.startswith("option start"):
        return "prev-token"
    if text.startswith("Prev. layer (l-"):
        return f"prev-layer:{int(text[len('Prev. layer (l-'):].split(')')[0])}"
    return "prev-layer"


def simulate_prefetch(stream: EventStream, config: ProactiveConfig, profile: HardwareProfile, advice=None, *,
                      issue: str = "prev-layer", count_mask: np.ndarray | None = None,
                      expert_bytes: int | None = None) -> TimingResult:
    """Replay ``stream`` with pre-access refinement and put demand misses and prefetches on one timeline.

    Parameters
    ----------
    stream
        The event stream.
    config
        The proactive replay (retention key, capacity, budget ``R``, ties, warm-up).
    profile
        The hardware profile; the contract is ``fused`` (the proactive replay is event-atomic).
    advice
        :class:`expertcache.nextuse.Advice` (``prefetch_score`` when ``R > 0``, ``priority`` for the ``advice``
        key).
    issue
        When each event's prefetches are issued: ``prev-layer``, ``prev-layer:D`` or ``prev-token``.
    count_mask
        Events to count (with ``config.warmup_events``), as in :func:`replay_proactive`.
    expert_bytes
        Bytes per expert block; default: the profile's, else the stream's recorded ``expert_block_bytes``.
    """
    lead = issue_lead(issue, stream.n_layers)
    nbytes = expert_bytes or profile.expert_bytes or recorded_expert_bytes(stream)
    if nbytes is None:
        raise ValidationError("the expert block size is unknown: give the profile an expert_bytes, pass "
                              "--expert-bytes, or build the stream from a trace that records expert_block_bytes",
                              field="expert_bytes")
    result, done = replay_proactive_hits(stream, config, advice, count_mask)
    n = stream.n_events
    counted = np.ones(n, dtype=np.bool_) if count_mask is None else np.asarray(count_mask, dtype=np.bool_).copy()
    counted[:int(config.warmup_events)] = False
    out = [np.zeros(n, dtype=np.float64) for _ in range(5)]
    n_pf = int(done.prefetch_expert.shape[0])
    pf_land, pf_state, pf_wait = np.zeros(n_pf), np.zeros(n_pf, dtype=np.int8), np.zeros(n_pf)
    K.timeline_prefetch(stream.offsets, stream.expert, stream.multiplicity, done.hit.view(np.uint8),
                        stream.step.astype(np.int64), stream.layer, layer_tokens(stream),
                        profile.per_layer(stream.n_layers), float(profile.step_fixed_s),
                        float(profile.step_per_token_s), float(profile.transfer_s(int(nbytes))),
                        int(profile.copy_streams), not profile.overlap, stream.n_experts, done.prefetch_offsets,
                        done.prefetch_expert, lead, counted, *out, pf_land, pf_state, pf_wait)
    own = np.repeat(counted, np.diff(done.prefetch_offsets))         # prefetches of counted events
    timely = int((pf_state[own] == 1).sum())
    late = int((pf_state[own] == 2).sum())
    n_loads = int(own.sum())
    r = build_result(stream, profile, out, counted, int(nbytes), result.transferred,
                     policy=config.priority, contract="fused", semantics="event-atomic", scope="per-layer",
                     rho=result.rho, capacity_total=result.capacity_total, demand_misses=result.demand_misses,
                     hits=result.hits, initial_load=0, replay=result, prefetch_budget=int(config.prefetch_budget),
                     issue=issue, prefetch_loads=n_loads, prefetch_timely=timely, prefetch_late=late,
                     prefetch_useless=n_loads - timely - late,
                     prefetch_late_stall_s=float(pf_wait[own & (pf_state == 2)].sum()))
    return r
