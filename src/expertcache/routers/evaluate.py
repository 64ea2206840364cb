"""Evaluation of the Cache-Learning Routers: Table 1 / Table 3 shapes, concentration, accuracy.

Every cache number comes from the proactive-load-aware replay
(:func:`expertcache.replay.proactive.replay_proactive`): the Temporal Router is
``U_B`` on ``Advice.priority`` with no pre-access refinement (``R = 0``, so
``P = 0`` and ``AdjHit = Hit``); the Spatio-Temporal Router adds refinement
with budget ``R`` on ``Advice.prefetch_score``; the classic rows are LRU, LFU
and LRFU (``lambda = 0.5``) on the same stream (CLR Tab. 1). As in CLR Tab. 3,
a budget sweep replays one checkpoint's advice at several ``R``.

Caveat stated with every table: CLR compares *configurations* (the LM-only
backbone's routing for the classic rows, the post-trained backbone's for
theirs). With auxiliary-only training (backbone frozen) the routing is the
same for every row, so this comparison is on identical trajectories.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..events import EventStream
from .advice import RouterAdvice

__all__ = ["TableRow", "BASELINE_ROWS", "COMPARE_BASELINES", "baseline_rows", "per_request_prefill", "results_table", "temporal_hit", "hit_evaluator", "budget_sweep", "capacity_sweep", "AccuracyResult", "exact_match",
           "concentration_by_weight", "CLASSIC"]

#: The classic replacement rows of CLR Tab. 1 (retention keys of the proactive replay).
CLASSIC = ("lru", "lfu", "lrfu")

#: Row name, retention key, decision availability of each baseline row (``expertcache prefetch compare`` spells
#: the same rows in lower case). SpecMD Least-Stale replays with the LRU key: with one event per (step, layer)
#: and per-layer caches the stalest step holds the least recently used block.
BASELINE_ROWS = (("LRU", "lru", "Curr. layer"), ("LFU", "lfu", "Curr. layer"), ("LRFU", "lrfu", "Curr. layer"),
                 ("Least-Stale (SpecMD)", "lru", "Curr. layer"))


@dataclass(frozen=True)
class TableRow:
    """One row of a CLR Table 1-shaped results table.

    Attributes
    ----------
    method
        ``LRU``, ``LFU``, ``LRFU``, ``Least-Stale (SpecMD)``, ``Temporal Router`` or ``Spatio-Temporal Router``.
    category
        ``update-only`` (``P = 0``) or ``prefetch``.
    availability
        When the row's decision inputs exist (CLR Tab. 1's column): ``Curr. layer`` for the classic keys,
        ``Curr. layer (h_l)`` for the Temporal Router, ``Prev. layer (h_(l-1))`` for its pre-access refinement.
    capacity, budget
        ``B`` per layer and ``R`` (0 for update-only).
    added_parameters
        Inference-time parameters the method adds (0 for classic policies).
    accuracy
        Exact match in ``[0, 1]`` when measured, else ``None``.
    hit, adj_hit, load_per_token, load_unit, miss_fraction
        CLR's metrics and the evaluation paper's ``m`` on the same run.
    accesses, demand_misses, proactive_loads, tokens
        ``A``, ``D``, ``P``, ``T`` of the counted (decode) events.
    """

    method: str
    category: str
    availability: str
    capacity: int
    budget: int
    added_parameters: int
    accuracy: float | None
    hit: float
    adj_hit: float
    load_per_token: float
    load_unit: str
    miss_fraction: float
    accesses: int
    demand_misses: int
    proactive_loads: int
    tokens: int

    def to_dict(self) -> dict[str, Any]:
        """Plain fields, for JSON."""
        return asdict(self)


def _engine_advice(advice: RouterAdvice) -> Any:
    return advice.to_advice()


def _availability(method: str, budget: int) -> str:
    for name, _, avail in BASELINE_ROWS:
        if name == method:
            return avail
    return "Prev. layer (h_(l-1)) + Curr. layer" if budget > 0 else "Curr. layer (h_l)"


def _row(method: str, stream: EventStream, priority: str, capacity: int, budget: int, advice: Any, *,
         warmup: int, expert_bytes: int | None, tie_break: str, seed: int, added: int,
         accuracy: float | None, count_mask: np.ndarray | None = None) -> TableRow:
    from ..replay.proactive import ProactiveConfig, replay_proactive

    cfg = ProactiveConfig(priority=priority, capacity=(int(capacity),) * stream.n_layers, prefetch_budget=int(budget),
                          tie_break=tie_break, seed=seed, warmup_events=0 if count_mask is not None else int(warmup),
                          expert_bytes=expert_bytes)
    r = replay_proactive(stream, cfg, advice, count_mask=count_mask)
    return TableRow(method, "prefetch" if budget > 0 else "update-only", _availability(method, budget),
                    int(capacity), int(budget), int(added),
                    accuracy, r.hit, r.adj_hit, r.load_per_token, r.load_unit, r.miss_fraction, r.accesses,
                    r.demand_misses, r.proactive_loads, r.tokens)


def _check_capacity(stream: EventStream, capacity: int) -> None:
    _check_capacity_n(stream.n_experts, capacity)


def results_table(stream: EventStream, advice: RouterAdvice, capacity: int, budget: int, *,
                  added_temporal: int = 0, added_full: int = 0, warmup: int | None = None,
                  expert_bytes: int | None = None, tie_break: str = "random", seed: int = 0,
                  accuracy: dict[str, float] | None = None, native: RouterAdvice | None = None,
                  progress: Callable[[int, int], None] | None = None,
                  count_mask: np.ndarray | None = None) -> list[TableRow]:
    """CLR Table 1 shape on one stream: classic rows, the Temporal Router, the Spatio-Temporal Router.

    ``warmup`` defaults to the advice's (the stream's prefill warm-up); the
    Spatio-Temporal row appears when ``budget > 0`` and the advice has any
    pre-access score. ``accuracy`` maps a method name to its exact match.
    ``native`` (advice built with ``use="native"``) adds a reference row,
    ``U_B`` on ``p^R`` alone: the Temporal Router at its initialisation
    (``W^T = W^R`` gives ``s^T = 2 p^R``, the same ranking), so the gap to the
    Temporal row is what training added. ``count_mask`` (one bool per event) replaces the leading warm-up:
    the events outside it replay but are not counted (CLR §4.1's per-request prefill, :func:`per_request_prefill`).
    """
    _check_capacity(stream, capacity)
    if advice.priority.shape != (stream.n_events, stream.n_experts):
        raise ValidationError(f"advice has {advice.priority.shape[0]} events; the stream has {stream.n_events}")
    warm = advice.warmup_events if warmup is None else int(warmup)
    eng = _engine_advice(advice)
    acc = accuracy or {}
    jobs: list[tuple[str, str, int, int, Any]] = [(name, key, 0, 0, None) for name, key, _ in BASELINE_ROWS]
    if native is not None:
        jobs.append(("Native p^R (untrained)", "advice", 0, 0, _engine_advice(native)))
    jobs.append(("Temporal Router", "advice", 0, added_temporal, eng))
    if budget > 0 and advice.prefetch_score is not None and np.isfinite(advice.prefetch_score).any():
        jobs.append(("Spatio-Temporal Router", "advice", budget, added_full, eng))
    rows = []
    for i, (name, pri, r, added, adv) in enumerate(jobs):
        rows.append(_row(name, stream, pri, capacity, r, adv, warmup=warm, expert_bytes=expert_bytes,
                         tie_break=tie_break, seed=seed, added=added, accuracy=acc.get(name), count_mask=count_mask))
        if progress is not None:
            progress(i + 1, len(jobs))
    return rows


def budget_sweep(stream: EventStream, advice: RouterAdvice, capacity: int, budgets: Sequence[int], *,
                 warmup: int | None = None, expert_bytes: int | None = None, tie_break: str = "random",
                 seed: int = 0, count_mask: np.ndarray | None = None) -> list[TableRow]:
    """CLR Table 3, ``R`` half: one checkpoint's advice replayed at every budget ``R`` (``R = 0``: Temporal)."""
    _check_capacity(stream, capacity)
    warm = advice.warmup_events if warmup is None else int(warmup)
    eng = _engine_advice(advice)
    return [_row("Temporal Router" if r == 0 else "Spatio-Temporal Router", stream, "advice", capacity, r, eng,
                 warmup=warm, expert_bytes=expert_bytes, tie_break=tie_break, seed=seed, added=0, accuracy=None,
                 count_mask=count_mask)
            for r in budgets]


def capacity_sweep(stream: EventStream, advice: RouterAdvice, capacities: Sequence[int], *,
                   warmup: int | None = None, expert_bytes: int | None = None, tie_break: str = "random",
                   seed: int = 0, count_mask: np.ndarray | None = None) -> list[TableRow]:
    """CLR Table 3, ``B`` half: LRU and the Temporal Router at every capacity ``B`` (update-only)."""
    warm = advice.warmup_events if warmup is None else int(warmup)
    eng = _engine_advice(advice)
    rows = []
    for b in capacities:
        _check_capacity(stream, b)
        for name, pri in (("LRU", "lru"), ("Temporal Router", "advice")):
            rows.append(_row(name, stream, pri, b, 0, eng, warmup=warm, expert_bytes=expert_bytes,
                             tie_break=tie_break, seed=seed, added=0, accuracy=None, count_mask=count_mask))
    return rows


def per_request_prefill(trace: Any, advice: RouterAdvice) -> tuple[EventStream, np.ndarray, RouterAdvice]:
    """CLR §4.1's protocol, the one ``expertcache prefetch compare`` uses: each request's prompt before its decode.

    ``advice`` must be for ``build_events(trace, 1)`` (no warm-up). Returns the prefill-initialised stream of
    :func:`expertcache.prefetch.context.advice_context` (batch 1), its count mask (decode events) and the advice
    laid out on it: decode rows where they were, each prefill event's member multiplicities as its priority (the
    same padding a leading warm-up gets) and no pre-access candidates.
    """
    from ..prefetch.context import advice_context

    if advice.warmup_events:
        raise ValidationError("per-request prefill needs advice for the plain decode stream (no warm-up)")
    ctx = advice_context(trace, 1, True)
    s, mask = ctx.stream, np.asarray(ctx.count_mask, dtype=bool)
    if int(mask.sum()) != advice.priority.shape[0]:
        raise ValidationError(f"advice has {advice.priority.shape[0]} decode events; the schedule has {int(mask.sum())}")
    N = s.n_experts
    pri = np.zeros((s.n_events, N), dtype=np.float32)
    pri[mask] = advice.priority
    pre_ev = np.flatnonzero(~mask)
    for e in pre_ev.tolist():
        lo, hi = int(s.offsets[e]), int(s.offsets[e + 1])
        pri[e, s.expert[lo:hi].astype(np.int64)] = s.multiplicity[lo:hi]
    score = None
    if advice.prefetch_score is not None:
        score = np.full((s.n_events, N), -np.inf, dtype=np.float32)
        score[mask] = advice.prefetch_score
    prov = {**advice.provenance, "protocol": "per-request prefill-initialised decode (CLR §4.1)"}
    return s, mask, RouterAdvice(pri, score, 0, prov)


def temporal_hit(trace: Any, hidden: np.ndarray, logits: np.ndarray, weights: Any, capacity: int, *,
                 tie_break: str = "random", seed: int = 0) -> float:
    """Hit (%) of the Temporal Router at ``P = 0`` on ``trace``: the "Temporal Router" row of ``routers eval``.

    Batch 1 under the per-request prefill protocol (:func:`per_request_prefill`), update-only, no pre-access
    loads, so ``AdjHit = Hit``. ``weights`` is a :class:`~.checkpoint.RouterWeights` (a checkpoint, or
    :func:`~.checkpoint.weights_of` live routers during training).
    """
    from .advice import router_advice

    _check_capacity_n(trace.n_experts, capacity)
    adv = router_advice(trace, hidden, logits, weights, 1)
    stream, mask, adv = per_request_prefill(trace, adv)
    row = _row("Temporal Router", stream, "advice", capacity, 0, _engine_advice(adv), warmup=0, expert_bytes=None,
               tie_break=tie_break, seed=seed, added=0, accuracy=None, count_mask=mask)
    return float(row.hit)


def hit_evaluator(trace: Any, hidden: np.ndarray, logits: np.ndarray, capacity: int, *, tie_break: str = "random",
                  seed: int = 0) -> Callable[[Any], dict[str, float]]:
    """``evaluate`` for the training loops: the live Temporal Router's Hit (%) on a held-out trace.

    The number ``routers eval`` prints in its "Temporal Router" row for a checkpoint of these weights (batch 1,
    per-request prefill, ``P = 0``; :func:`temporal_hit`), so the log shows the quantity the run is
    for beside the loss of its detached-threshold surrogate. The trace's hidden states are its own backbone's:
    in the joint modes, where the backbone moves, this scores the routers on the original routing.
    """
    from .checkpoint import weights_of

    _check_capacity_n(trace.n_experts, capacity)

    def evaluate(routers: Any) -> dict[str, float]:
        w = weights_of(routers)
        if w.temporal_w.shape[:2] != (trace.n_layers, trace.n_experts) or w.temporal_w.shape[2] != hidden.shape[2]:
            raise ValidationError(f"the evaluation trace is (L, N, d) = ({trace.n_layers}, {trace.n_experts}, "
                                  f"{hidden.shape[2]}); the routers are {tuple(w.temporal_w.shape)}")
        return {"hit": temporal_hit(trace, hidden, logits, w, capacity, tie_break=tie_break, seed=seed)}

    return evaluate


def _check_capacity_n(n_experts: int, capacity: int) -> None:
    if not 1 <= capacity < n_experts:
        raise ValidationError(f"capacity B must be in [1, N) = [1, {n_experts}); got {capacity}")


#: The ``prefetch compare`` baselines ``routers eval --baselines`` adds (the classic rows are already there).
COMPARE_BASELINES = ("moe-infinity", "promoe", "finemoe", "te-moe", "te-moe-oracle", "next-true")


def baseline_rows(trace: Any, calibration: Any, capacity: int, budget: int, *, expert_bytes: int | None,
                  tie_break: str, seed: int, hidden: np.ndarray | None = None,
                  hidden_calibration: np.ndarray | None = None) -> list[TableRow]:
    """The MoE caching / prefetch baselines of ``expertcache prefetch compare`` as rows of the same table.

    Same trace, same per-request prefill-initialised protocol (batch 1), same capacity, ties and seed as the
    router rows; predictors and stores fitted on ``calibration``. ``budget`` is their pre-access ``R``; ProMoE
    looks ``d = min(3, L - 1)`` layers ahead (``prefetch compare``'s default where the model is deep enough).
    """
    from ..prefetch.comparison import CompareConfig, compare

    names = COMPARE_BASELINES if trace.n_layers > 1 else tuple(n for n in COMPARE_BASELINES if n != "promoe")
    cfg = CompareConfig(capacity=int(capacity), budget=int(budget), batch=1, prefill_init=True, seed=seed,
                        tie_break=tie_break, expert_bytes=expert_bytes, policies=names,
                        lookahead=max(1, min(3, trace.n_layers - 1)))   # ProMoE's d = 3, or the deepest L allows
    rep = compare(trace, cfg, calibration=calibration, hidden=hidden, hidden_calibration=hidden_calibration)
    out = []
    for row in rep.rows:
        r = row.result
        if r is None:
            continue
        out.append(TableRow(f"{row.name} ({row.family})", "prefetch" if r.prefetch_budget > 0 else "update-only",
                            row.availability, int(capacity), int(r.prefetch_budget), int(row.added_params or 0), None,
                            r.hit, r.adj_hit, r.load_per_token, r.load_unit, r.miss_fraction, r.accesses,
                            r.demand_misses, r.proactive_loads, r.tokens))
    return out


def concentration_by_weight(traces: Sequence[tuple[float, Any]]) -> list[dict[str, float]]:
    """Expert-usage concentration (CLR Fig. 2-3) of decode routing, one record per cache-loss weight ``s_w``.

    ``traces`` pairs ``s_w`` with the RoutingTrace collected from the checkpoint
    trained at that weight. Records hold the max expert frequency, the top-8
    mass, the entropy (nats) and the effective number of experts, averaged over layers.
    """
    from ..analysis.concentration import concentration, selection_counts

    out = []
    for sw, trace in sorted(traces, key=lambda t: t[0]):
        st = concentration(selection_counts(trace), min(8, trace.n_experts))
        out.append({"cache_weight": float(sw), "max_frequency": st.overall_max_frequency,
                    "top8_mass": st.overall_topk_mass, "entropy": st.overall_entropy,
                    "effective_experts": st.overall_effective_experts})
    return out


@dataclass(frozen=True)
class AccuracyResult:
    """Exact match of greedy decoding on a GSM8K-format task file."""

    n_tasks: int
    n_correct: int
    max_new_tokens: int
    predictions: tuple[str | None, ...]

    @property
    def accuracy(self) -> float:
        """``n_correct / n_tasks``."""
        return self.n_correct / self.n_tasks if self.n_tasks else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain fields plus the accuracy, for JSON."""
        return {"n_tasks": self.n_tasks, "n_correct": self.n_correct, "accuracy": self.accuracy,
                "max_new_tokens": self.max_new_tokens}


def exact_match(model: Any, tokenizer: Any, tasks: Sequence[Any], *, max_new_tokens: int = 256,
                chat_template: bool = True, progress: Callable[[int, int], None] | None = None) -> AccuracyResult:
    """Greedy-decode every task and compare the final number with the reference (``#### N``).

    The prompt is the question, through the tokenizer's chat template when it
    has one and ``chat_template`` is set; the prediction is the number after
    ``####`` in the output, else its last number (:func:`~.data.final_number`).
    """
    import torch

    from .data import final_number

    device = next(model.parameters()).device
    model.eval()
    preds: list[str | None] = []
    correct = 0
    for i, task in enumerate(tasks):
        if chat_template and getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": task.question}],
                                                add_generation_prompt=True, return_tensors="pt", return_dict=True)
            ids = ids["input_ids"]
        else:
            ids = tokenizer(task.question, return_tensors="pt")["input_ids"]
        ids = ids.to(device)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
        text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        pred = final_number(text)
        preds.append(pred)
        correct += int(pred is not None and pred == task.reference)
        if progress is not None:
            progress(i + 1, len(tasks))
    return AccuracyResult(len(tasks), correct, int(max_new_tokens), tuple(preds))
