"""The workload section of the Appendix B.1 reporting block (B1–B7), filled from measurements.

:func:`workload_block` returns the section's one-line answers as strings,
keyed as ``expertcache.report`` keys them. A field that cannot be measured
from what was given reads ``"not reported"`` (or the trace manifest's own
declaration, when it has one).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from ..errors import ValidationError
from ..events import ArrivalOffsets, decode_rows, fcfs_decode_schedule
from ..trace import RoutingTrace
from .routes import RouteAudit, RouteAuditConfig, route_audit

__all__ = ["workload_block", "WORKLOAD_FIELDS", "NOT_REPORTED", "NO_FIXED_ARM"]

NOT_REPORTED = "not reported"
#: Keys of the returned dict, in the order of Appendix B.1.
WORKLOAD_FIELDS = ("templates_per_category", "distinct_prompt_heads", "distinct_final_lines",
                   "chat_template_applied", "decode_steps_recorded", "position_locked_cohorts",
                   "unique_generated_sequences", "positional_token_agreement",
                   "expert_jaccard_low_text_overlap", "effect_stable_across_position_bands",
                   "matched_pair_attribution")

#: B8 when the trace has no fixed-template arm to pair with the diverse one.
NO_FIXED_ARM = "not measured: no fixed arm"


def _span(values: Sequence[float | int], fmt: str = "{}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}-{fmt.format(hi)}"


def _declared(prov: dict, *keys: str) -> str:
    for k in keys:
        v = prov.get(k, prov.get("trace_provenance", {}).get(k) if isinstance(prov.get("trace_provenance"), dict)
                     else None)
        if v is not None:
            return ("yes" if v else "no") if isinstance(v, bool) else str(v)
    return NOT_REPORTED


def workload_block(trace: RoutingTrace | None = None,
                   labels: dict[str, str] | str | os.PathLike[str] | None = None, *,
                   route: RouteAudit | None = None, prompts: Sequence | None = None,
                   offsets: ArrivalOffsets | None = None,
                   config: RouteAuditConfig | None = None, batch: int | None = None,
                   matched: str | None = None) -> dict[str, str]:
    """The Appendix B.1 workload fields as strings.

    Parameters
    ----------
    trace
        The routing trace (route-side fields, decode steps, position locking).
    labels
        Categories (mapping, labels file, or ``None`` for the trace's own). A
        labels file with an ``arm`` column excludes the fixed-template arm. A
        trace without any categories is audited as one category.
    route
        A :func:`route_audit` result to use instead of computing one.
    prompts
        :class:`expertcache.probes.PromptStats` rows (prompt-side B1 fields).
    offsets
        Arrival offsets of the measured schedule (position locking needs them; default zero).
    batch
        Concurrency ``B`` of the measured FCFS schedule: position locking is read off that schedule
        (requests whose first decode token runs at the same step occupy aligned decode positions, §5.2).
        ``None``: every request is admitted on arrival (requests locked when they arrive together).
    matched
        The B8 answer when matched-pair attribution was measured elsewhere; ``None`` reads
        ``"not measured: no fixed arm"`` unless the labels carry a fixed arm.
    """
    config = config or RouteAuditConfig()
    out = {k: NOT_REPORTED for k in WORKLOAD_FIELDS}
    prov = trace.provenance if trace is not None else {}
    out["chat_template_applied"] = _declared(prov, "chat_template_applied", "chat_template")
    for key in ("templates_per_category", "distinct_prompt_heads", "distinct_final_lines"):
        out[key] = _declared(prov, key)
    if prompts:
        diverse = [p for p in prompts if p.arm != "fixed"] or list(prompts)
        fixed = [p for p in prompts if p.arm == "fixed"]
        n = _span([p.n_records for p in diverse])
        if all(p.n_templates is not None for p in diverse):
            out["templates_per_category"] = (f"{_span([p.n_templates for p in diverse])} per {n}-record category"
                                             + ("; 1 (matched control arm, by design)" if fixed else ""))
        out["distinct_prompt_heads"] = f"{_span([p.n_heads for p in diverse])} per {n}-record category"
        out["distinct_final_lines"] = f"{_span([p.n_finals for p in diverse])} per {n}-record category"
    if trace is None:
        return out
    all_lengths, _ = decode_rows(trace)
    lengths = all_lengths[all_lengths > 0]
    out["decode_steps_recorded"] = (f"up to {int(lengths.max())} (mean {lengths.mean():.1f})"
                                    if lengths.size else NOT_REPORTED)
    offs = offsets or ArrivalOffsets()
    out["position_locked_cohorts"] = _position_locked(trace, offs, batch, all_lengths)
    arms = None
    if labels is not None and not isinstance(labels, dict):
        from .matched import read_arms

        arms = read_arms(labels)
    has_fixed = bool(arms is not None and arms.fixed_mask(trace).any())
    if matched is not None:
        out["matched_pair_attribution"] = matched
    elif has_fixed:
        out["matched_pair_attribution"] = _matched_summary(trace, labels, arms, config)
    else:
        out["matched_pair_attribution"] = NO_FIXED_ARM
    if route is None:
        exclude = arms.fixed_mask(trace) if arms else None
        try:
            route = route_audit(trace, labels, config, exclude)
        except ValidationError:
            if labels is not None or trace.provenance.get("categories"):
                raise
            route = route_audit(trace, {r: "all" for r in trace.request_ids}, config)
    cats = route.categories
    out["unique_generated_sequences"] = (f"{route.unique_sequences} / {route.n_requests}"
                                         + ("" if route.basis == "tokens" else " (by routes; no token ids)"))
    means = [c.agreement_mean for c in cats if c.agreement_mean is not None]
    if means:
        p95 = route.within_agreement_p95
        out["positional_token_agreement"] = (
            f"{_span(means, '{:.2%}')} mean per category, p95 "
            + ("n/a" if p95 is None else f"{p95:.2%}") + " over within-category pairs (nearest rank)"
            + ("" if route.basis == "tokens" else " (route identity; no token ids)"))
    lows = [c.jaccard_low for c in cats if c.jaccard_low is not None]
    if lows:
        base = route.baseline_low
        text = f"{_span(lows, '{:.3f}')} (cross-category: {'n/a' if base is None else f'{base:.3f}'})"
        if route.basis != "tokens":
            n_low = sum(c.n_low_pairs for c in cats)
            n_all = sum(c.n_pairs for c in cats)
            text += (f"; no token ids: pairs chosen by routing identity below {route.config['low_agreement']:.0%}, "
                     f"not by text overlap ({n_low} of {n_all} within-category pairs qualify)")
        out["expert_jaccard_low_text_overlap"] = text
    measured = [c for c in cats if any(r is not None for r in c.band_reduction)]
    if len(cats) >= 2 and measured:
        stable = sum(c.stable for c in measured)
        text = f"yes for {stable} of {len(measured)} categories (bands {', '.join(route.bands)})"
        if route.flagged_categories:
            text += f"; effect in a shared-prefix band: {', '.join(route.flagged_categories)}"
        out["effect_stable_across_position_bands"] = text
    elif len(cats) < 2:
        out["effect_stable_across_position_bands"] = "n/a (one category)"
    return out


def _position_locked(trace: RoutingTrace, offsets: ArrivalOffsets, batch: int | None,
                     lengths: np.ndarray) -> str:
    """B4 from the schedule: requests whose first decode token runs at one step share decode positions (§5.2).

    Unequal lengths do not unlock them: a shared prefix sits at the start of every response, so requests
    admitted together meet it at the same scheduling steps whatever their lengths.
    """
    n = int((lengths > 0).sum())
    if n == 0:
        return NOT_REPORTED
    if batch is None:
        start = offsets.arrivals(trace.n_requests)[lengths > 0]
        how, verb = "arrive at a step shared with another", "arrive"
    else:
        step, req, tok, _ = fcfs_decode_schedule(trace, batch, offsets)
        start = step[tok == 0]
        how, verb = f"start decoding at a step shared with another (B = {batch})", "start decoding"
    _, counts = np.unique(start, return_counts=True)
    locked = int(counts[counts >= 2].sum())
    lens = lengths[lengths > 0]
    equal = bool((lens == lens[0]).all())
    if locked == 0:
        return f"no (no two requests {verb} at the same step; arrival offsets {offsets.describe()})"
    if locked == n and equal and counts.size == 1:
        return "yes (equal lengths, common admission: lock-step)"
    return (f"yes ({locked} of {n} requests {how}, arrival offsets {offsets.describe()}: aligned decode positions"
            + ("" if equal else ", lengths unequal") + ")")


def _matched_summary(trace: RoutingTrace, labels, arms, config: RouteAuditConfig) -> str:
    """B8 in one line: the attributable union reduction (fixed minus diverse arm) of each band, over categories."""
    from .matched import matched_attribution

    try:
        res = matched_attribution(trace, labels, arms, config)
    except ValidationError as exc:
        return f"not measured: {exc.detail}"
    parts = []
    for j, band in enumerate(res.bands):
        vals = [r.attributable[j] for r in res.rows if r.attributable[j] is not None]
        if vals:
            parts.append(f"band {band} {_span(vals, '{:+.1%}')}")
    n = sum(r.n_matched for r in res.rows)
    return (f"fixed minus diverse arm, union reduction: {'; '.join(parts) or 'no band measured'} "
            f"({n} matched sources in {len(res.rows)} categories, cohorts of {res.cohort_size})")
