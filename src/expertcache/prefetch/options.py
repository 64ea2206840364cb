"""Option-set persistence in the style of Temporally Extended MoE, and the next-true-experts oracle.

Temporally Extended MoE commits, per layer, to an *option*: a set of experts
kept for several tokens, with routing constrained to it, so that every access
hits. Re-expressed on a fixed trace (routing cannot be constrained after the
fact): every ``option_steps`` decode steps, each layer's cache is refilled
with the option set — the experts the trace routes to at that layer during
the option (``source="future"``: the set a committed option would have to
contain, an upper bound on its hit rate) or during the previous option
(``source="past"``, causal) — every insertion charged as a proactive load,
and retention pins the option (``U_B`` on the option's use counts). The hard
hit rate approaches 100% while ``AdjHit`` and Load/token show the cost: the
point of CLR §4.2 that a perfect hard hit rate is not efficiency.

:func:`next_true` is the reference prefetcher of the issue's tests: before
each event it proposes exactly the experts the event will use.
"""

from __future__ import annotations

import numpy as np

from ..errors import ValidationError
from ..events import EventStream
from ..events.stream import concat_ranges
from ..nextuse.advice import Advice
from .context import warmup_advice
from .produced import Produced

__all__ = ["option_set", "next_true"]


def _counted(stream: EventStream, count_mask: np.ndarray | None) -> np.ndarray:
    return np.ones(stream.n_events, dtype=np.bool_) if count_mask is None else count_mask


def option_set(stream: EventStream, option_steps: int = 4, source: str = "future",
               count_mask: np.ndarray | None = None) -> Produced:
    """Option-set advice on ``stream`` (see the module docstring); works on event streams, no trace needed.

    Options are windows of ``option_steps`` consecutive counted steps. The first
    event of each window at each layer carries the option as ``prefetch_score``
    (use counts, multiplicity-weighted; unused experts are no candidates); every
    event of the window carries it as retention ``priority``. Uncounted (warm-up) events carry
    the rows every producer gives them (:func:`.context.warmup_advice`).
    """
    if isinstance(option_steps, bool) or not isinstance(option_steps, (int, np.integer)) or option_steps < 1:
        raise ValidationError(f"option_steps must be a positive integer; got {option_steps!r}", field="option_steps")
    if source not in ("future", "past"):
        raise ValidationError(f"source must be 'future' or 'past'; got {source!r}", field="source")
    counted = _counted(stream, count_mask)
    L, N = stream.n_layers, stream.n_experts
    prio = np.full((stream.n_events, N), np.nan, dtype=np.float32)
    pf = np.full((stream.n_events, N), -np.inf, dtype=np.float32)
    ev = np.flatnonzero(counted)
    step_rank = np.searchsorted(np.unique(stream.step[ev]), stream.step[ev])
    option = step_rank // option_steps
    n_opt = int(option.max()) + 1 if ev.size else 0
    # use counts per (option, layer, expert), a chunk of options at a time: never [n_options, L, N] at once
    prev = np.zeros((1, L * N), dtype=np.float64)                            # counts of the option before
    span = max(1, (1 << 20) // (L * N))      # options per chunk: counts ~8 MB, their rows per event about 4x
                                             # that (at 4M cells, those rows were the peak of `prefetch compare`)
    for lo in range(0, n_opt, span):
        hi = min(n_opt, lo + span)
        e0, e1 = np.searchsorted(option, [lo, hi])                           # the chunk's counted events
        evs = ev[e0:e1]
        first_acc = stream.offsets[evs]
        sizes = stream.offsets[evs + 1] - first_acc
        acc = concat_ranges(first_acc, sizes)
        cell = ((option[e0:e1] - lo) * L + stream.layer[evs]) * N            # (option, layer) row of each event
        counts = np.bincount(np.repeat(cell, sizes) + stream.expert[acc], weights=stream.multiplicity[acc],
                             minlength=(hi - lo) * L * N).reshape(hi - lo, L * N)
        use = counts if source == "future" else np.concatenate([prev, counts[:-1]], axis=0)
        prev = counts[-1:].copy()
        prio[evs] = use.reshape((hi - lo) * L, N)[cell // N]
    first = np.ones(ev.size, dtype=np.bool_)
    key = option * L + stream.layer[ev]
    _, first_idx = np.unique(key, return_index=True)
    first[:] = False
    first[first_idx] = True
    start = ev[first]
    cand = prio[start]
    cand[cand <= 0] = -np.inf
    pf[start] = cand
    prio, pf = warmup_advice(stream, count_mask, prio, pf)
    adv = Advice(priority=prio, prefetch_score=pf,
                 provenance={"producer": "option-set persistence (Temporally Extended MoE style)",
                             "option_steps": int(option_steps), "source": source})
    avail = "option start (future routing: upper bound)" if source == "future" else "option start (prev. option)"
    return Produced(adv, "advice", True, added_params=0, availability=avail,
                    note=f"option of {option_steps} steps reloaded at each boundary; routing not constrained "
                         f"(trace-driven); set from the {'current' if source == 'future' else 'previous'} window",
                    details={"option_steps": int(option_steps), "source": source})


def next_true(stream: EventStream, count_mask: np.ndarray | None = None) -> Produced:
    """Prefetch exactly the experts of each event before it (an oracle; Hit = 100% when ``R`` and ``c`` allow).

    Uncounted (warm-up) events get no candidates, as for every producer (:func:`.context.warmup_advice`).
    """
    pf = np.full((stream.n_events, stream.n_experts), np.nan, dtype=np.float32)
    pf[stream.event_of_access, stream.expert.astype(np.int64)] = 1.0
    _, pf = warmup_advice(stream, count_mask, None, pf)
    adv = Advice(prefetch_score=pf, provenance={"producer": "next-true experts (oracle)"})
    return Produced(adv, "lru", True, availability="none (oracle: the event's own routing)",
                    note="reference: prefetches the true experts of the event")
