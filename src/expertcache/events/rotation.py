"""Deadline rotation and affinity schedulers (evaluation paper §8.3, §8.4, §9.3; docs/design.md §4).

Up to ``A`` sessions are admitted (FCFS by arrival, then input order; a
finished session frees its slot); at most ``B`` of them are served per step;
no admitted session waits more than ``W`` steps between services (its
deadline). Every scheduler shares these admission, service and completion
rules and differs only in which non-mandatory sessions fill the step. The
mandatory sessions are the earliest deadlines that later steps could not
absorb (for every horizon ``h < W``, those due within ``h`` steps beyond the
``B*h`` later slots), so any scheduler keeps every deadline when ``A <= B*W``:

* ``fcfs_deadline`` — earliest deadline first (least recently served, then admission order);
* ``causal_prev_route`` — greedily minimise the predicted union, each session
  predicted by its per-layer expert sets at its previous executed token (a
  session not yet served is predicted to bring ``k`` new experts per layer);
* ``oracle_current_route`` — the same greedy on the true sets of the tokens
  about to execute, and never worse than the causal choice at the same state
  (it evaluates that choice too and keeps the smaller true union): a rolling,
  route-aware bound, not a global optimum.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..errors import ValidationError
from ..trace.model import RoutingTrace
from ._kernels import greedy_union as _greedy_union
from ._kernels import union_size as _union_size
from .fcfs import ArrivalOffsets, decode_rows, events_from_schedule
from .stream import EventStream

__all__ = ["SCHEDULERS", "RotationConfig", "RotationStats", "select_batch", "rotation_schedule", "rotation_events",
           "best_of_n_estimate"]

SCHEDULERS = ("fcfs_deadline", "causal_prev_route", "oracle_current_route")


@dataclass(frozen=True)
class RotationConfig:
    """Deadline rotation: ``admitted`` sessions, ``batch`` served per step, deadline ``window`` steps."""

    admitted: int = 24
    batch: int = 8
    window: int = 4
    scheduler: str = "fcfs_deadline"

    def __post_init__(self) -> None:
        if self.batch < 1 or self.admitted < self.batch or self.window < 1:
            raise ValidationError(f"need 1 <= batch <= admitted and window >= 1; got admitted={self.admitted}, "
                                  f"batch={self.batch}, window={self.window}", field="rotation")
        if self.scheduler not in SCHEDULERS:
            raise ValidationError(f"scheduler must be one of {', '.join(SCHEDULERS)}; got {self.scheduler!r}",
                                  field="scheduler")


@dataclass(frozen=True)
class RotationStats:
    """Service quality of one schedule."""

    mean_batch: float
    max_interval: int
    deadline_violations: int
    p99_latency_steps: float
    n_steps: int

    def to_dict(self) -> dict:
        return asdict(self)


def _union_cost(chosen_sets: list[np.ndarray], n_layers: int) -> int:
    """Total union size over layers of a list of ``(L, k)`` expert-set arrays."""
    if not chosen_sets:
        return 0
    stacked = np.stack(chosen_sets).astype(np.int64, copy=False)            # (m, L, k)
    return int(_union_size(stacked, int(stacked.max()) + 1))


def _stacked(sessions: list[int], sets: dict[int, np.ndarray | None], n_layers: int, top_k: int
             ) -> tuple[np.ndarray, np.ndarray]:
    """The sessions' ``(L, k)`` sets as one int64 ``(m, L, k)`` array (zeros where unknown) and a uint8 mask of
    the known ones."""
    k = next((sets[r].shape[1] for r in sessions if sets[r] is not None), top_k)      # experts a set holds a layer
    out = np.zeros((len(sessions), n_layers, k), dtype=np.int64)
    known = np.zeros(len(sessions), dtype=np.uint8)
    for i, r in enumerate(sessions):
        if sets[r] is not None:
            out[i] = sets[r]
            known[i] = 1
    return out, known


def _greedy(cands: list[int], base: list[int], sets: dict[int, np.ndarray | None], k: int, n_layers: int,
            order_key: dict[int, tuple], top_k: int) -> list[int]:
    """Greedily add ``k`` candidates minimising the union of known sets (unknown sets cost k per layer); among
    equal costs the first by ``order_key``. The counting runs in :func:`._kernels.greedy_union` (a Python loop over
    sets of each layer took about 45 of ``affinity``'s 56 s on a Qwen3-sized trace: docs/performance.md, *Session
    42*)."""
    pool = sorted((r for r in cands if r not in base), key=lambda x: order_key[x])
    if k <= 0 or not pool:
        return list(base)
    cand, known = _stacked(pool, sets, n_layers, top_k)
    held, held_known = _stacked(list(base), sets, n_layers, top_k)
    width = int(max(cand.max(initial=0), held.max(initial=0))) + 1
    picks = _greedy_union(cand, known, held, held_known, k, top_k, width)
    return list(base) + [pool[int(i)] for i in picks]


class _NextSets:
    """``(sessions) -> {session: (L, k) expert sets of its next token}`` at the current state."""

    def __init__(self, trace: RoutingTrace, first: np.ndarray, done_tok: np.ndarray) -> None:
        self.trace, self.first, self.done_tok = trace, first, done_tok

    def __call__(self, sessions: list[int]) -> dict[int, np.ndarray]:
        return {r: self.trace.experts[self.first[r] + self.done_tok[r]].astype(np.int64) for r in sessions}


def select_batch(config: RotationConfig, s: int, admitted: list[int], last: dict[int, int], order: dict[int, int],
                 prev_set: dict[int, np.ndarray | None], true_sets, n_layers: int, top_k: int) -> list[int]:
    """The sessions served at step ``s`` (the scheduler's only decision; shared rules around it).

    ``true_sets(sessions)`` returns the ``(L, k)`` expert sets of each session's next token; only
    ``oracle_current_route`` calls it.
    """
    B, W = config.batch, config.window
    if len(admitted) <= B:
        return list(admitted)
    edf = sorted(admitted, key=lambda x: (last[x], order[x]))
    # serve now the earliest deadlines that later steps could not absorb: for every horizon h,
    # the sessions due by s+h beyond the B*h slots of steps s+1..s+h (keeps every deadline feasible)
    due = np.array([last[r] + W - s for r in edf])          # steps left until each deadline
    # horizons h >= ceil(A/B) add nothing (at most A sessions are due, B*h slots): the same max, O(A/B) not O(W)
    need = max(int((due <= h).sum()) - B * h for h in range(min(W, -(-len(edf) // B) + 1)))
    mandatory = edf[:min(B, max(0, need))]
    room = B - len(mandatory)
    keys = {r: (last[r], order[r]) for r in admitted}
    if config.scheduler == "fcfs_deadline" or room == 0:
        return mandatory + [r for r in edf if r not in mandatory][:room]
    causal = _greedy(admitted, mandatory, prev_set, room, n_layers, keys, top_k)
    if config.scheduler == "causal_prev_route":
        return causal
    sets = true_sets(admitted)
    oracle = _greedy(admitted, mandatory, sets, room, n_layers, keys, top_k)
    c_oracle = _union_cost([sets[r] for r in oracle], n_layers)
    c_causal = _union_cost([sets[r] for r in causal], n_layers)
    return oracle if c_oracle <= c_causal else causal


def rotation_schedule(trace: RoutingTrace, config: RotationConfig, offsets: ArrivalOffsets | None = None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, RotationStats]:
    """Schedule the decode tokens of ``trace`` under deadline rotation.

    Returns ``(step, request, token, stats)``: request ``request[i]`` executes its
    decode token ``token[i]`` at ``step[i]``.
    """
    offsets = offsets or ArrivalOffsets()
    lengths, first = decode_rows(trace)
    arrivals = offsets.arrivals(trace.n_requests, trace.request_ids)
    queue = [int(r) for r in np.lexsort((np.arange(trace.n_requests), arrivals)) if lengths[r] > 0]
    L, k = trace.n_layers, trace.top_k
    A, W = config.admitted, config.window
    admitted: list[int] = []
    order: dict[int, int] = {}
    last: dict[int, int] = {}
    done_tok = np.zeros(trace.n_requests, dtype=np.int64)
    prev_set: dict[int, np.ndarray | None] = {}
    out_s: list[int] = []
    out_r: list[int] = []
    out_t: list[int] = []
    intervals_max, violations, batches = 0, 0, []
    finish: dict[int, int] = {}
    s = 0
    n_admitted = 0
    while queue or admitted:
        if not admitted and arrivals[queue[0]] > s:
            s = int(arrivals[queue[0]])
        while len(admitted) < A and queue and arrivals[queue[0]] <= s:
            r = queue.pop(0)
            admitted.append(r)
            order[r] = n_admitted
            n_admitted += 1
            last[r] = s - 1                      # its first wait counts from admission
            prev_set[r] = None
        serve = select_batch(config, s, admitted, last, order, prev_set, _NextSets(trace, first, done_tok), L, k)
        batches.append(len(serve))
        for r in serve:
            interval = s - last[r]
            intervals_max = max(intervals_max, interval)
            violations += interval > W
            out_s.append(s)
            out_r.append(r)
            out_t.append(int(done_tok[r]))
            prev_set[r] = trace.experts[first[r] + done_tok[r]].astype(np.int64)
            done_tok[r] += 1
            last[r] = s
        for r in [r for r in admitted if done_tok[r] >= lengths[r]]:
            admitted.remove(r)
            finish[r] = s
        s += 1
    lat = np.array([finish[r] - arrivals[r] + 1 for r in finish], dtype=np.float64)
    stats = RotationStats(float(np.mean(batches)), int(intervals_max), int(violations),
                          float(np.percentile(lat, 99, method="inverted_cdf")), len(batches))
    step, req, tok = (np.array(x, dtype=np.int64) for x in (out_s, out_r, out_t))
    idx = np.lexsort((req, step))
    return step[idx], req[idx], tok[idx], stats


def rotation_events(trace: RoutingTrace, config: RotationConfig, offsets: ArrivalOffsets | None = None
                    ) -> tuple[EventStream, RotationStats]:
    """The event stream of a rotation schedule, with its service statistics."""
    offsets = offsets or ArrivalOffsets()
    step, req, tok, stats = rotation_schedule(trace, config, offsets)
    prov = {"source": "routing_trace", "trace_provenance": trace.provenance,
            "discipline": f"rotation(A={config.admitted}, B={config.batch}, W={config.window})",
            "scheduler": config.scheduler, "batch": config.batch, "admitted": config.admitted,
            "window": config.window, "offsets": offsets.describe(), "phase": "decode"}
    return events_from_schedule(trace, step, req, tok, prov), stats


def best_of_n_estimate(trace: RoutingTrace, config: RotationConfig, n_draws: int = 300, n_steps: int = 20,
                       seed: int = 0, offsets: ArrivalOffsets | None = None) -> float:
    """The per-step best-of-N union reduction (§8.4): an UPPER BOUND, never an achievable gain.

    At ``n_steps`` steps sampled along the ``fcfs_deadline`` trajectory, ``n_draws``
    random compositions of ``B`` admitted sessions are drawn; the estimate is the
    mean over steps of ``1 - best union / mean union``. It is an order statistic
    and ignores conservation (deferred sessions must still be served), so it
    overstates what a schedule achieves over a whole trajectory.
    """
    offsets = offsets or ArrivalOffsets()
    lengths, first = decode_rows(trace)
    step, req, tok, _ = rotation_schedule(trace, RotationConfig(config.admitted, config.batch, config.window),
                                          offsets)
    # the admitted set at a step: sessions that have started and not finished
    start = {r: step[req == r].min() for r in np.unique(req)}
    end = {r: step[req == r].max() for r in np.unique(req)}
    rng = np.random.default_rng(seed)
    steps = np.unique(step)
    picks = rng.choice(steps, size=min(n_steps, steps.shape[0]), replace=False)
    L = trace.n_layers
    out = []
    for s in picks:
        live = [r for r in start if start[r] <= s <= end[r]]
        if len(live) <= config.batch:
            continue
        served_before = {r: int((req[(step < s)] == r).sum()) for r in live}
        sets = {r: trace.experts[first[r] + min(served_before[r], lengths[r] - 1)].astype(np.int64) for r in live}
        unions = [_union_cost([sets[r] for r in rng.choice(live, size=config.batch, replace=False)], L)
                  for _ in range(n_draws)]
        out.append(1.0 - min(unions) / float(np.mean(unions)))
    return float(np.mean(out)) if out else 0.0
