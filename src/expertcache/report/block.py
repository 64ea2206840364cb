"""The Appendix B.1 reporting block: every checklist field as measured, declared, or "not reported".

Conventions the block states and keeps everywhere in the report:

- every p95 is the **nearest-rank** percentile (the smallest value with at least 95% of the
  values at or below it; numpy ``method="inverted_cdf"``), never an interpolated one;
- the gap of the Oracle section is the mean over the report's tie seeds; the sweep tables,
  which replay one seed per point, say which seed they used;
- a field whose value rests on something inferred (an imported trace's ``N``, a batch larger than
  the trace's request count) carries the caveat on the same line.
"""

from __future__ import annotations

from typing import Any

from ..analysis.gap import CAUSAL_POLICIES
from .config import ReportConfig

__all__ = ["NOT_REPORTED"]

NOT_REPORTED = "not reported"


def _fmt(x: Any, pct: bool = False) -> str:
    if x is None:
        return NOT_REPORTED
    if isinstance(x, str):
        return x
    if isinstance(x, float):
        return f"{x:.2%}" if pct else f"{x:.4g}"
    return str(x)


def _span(lo: float, hi: float) -> str:
    return f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"


def _concurrency(d: dict[str, Any]) -> str:
    s, occ = d["service"], d["occupancy"]
    text = f"B = {_fmt(s['batch'])}"
    if isinstance(s["batch"], int) and occ["max_active"] < s["batch"]:
        n = s.get("n_requests")
        why = f"only {n} requests" if isinstance(n, int) and n < s["batch"] else "never filled"
        text += (f" configured; effective: at most {occ['max_active']} active, mean {occ['mean_active']:.2f} "
                 f"per step ({why})")
    else:
        text += f" (mean {occ['mean_active']:.2f} active per step)"
    return text


def _capacity(d: dict[str, Any], c: ReportConfig) -> str:
    rg = d["regime"]
    if c.scope == "global":
        text = f"{d['capacity']['total']} blocks shared by {d['shape']['n_layers']} layers (global pool)"
    else:
        caps = rg["capacity_per_layer"]
        text = f"{_span(min(caps), max(caps))} blocks (quota per layer; {sum(caps)} in all)"
    return text + ("; N is a lower bound (inferred), so the true quota may be larger" if d.get("shape_caveat") else "")


def _budget(d: dict[str, Any], c: ReportConfig) -> str:
    """§6.6's budget: given by hand (--bandwidth) or the hardware profile's bandwidth (--profile); which, said."""
    tr = d["traffic"]
    bw = tr.get("bandwidth_budget")
    if not bw or not c.target_tokens_per_s:
        return NOT_REPORTED
    return f"{bw:g} B/s at {c.target_tokens_per_s:g} tokens/s, {tr.get('bandwidth_budget_source', 'given')}"


def _bytes(d: dict[str, Any]) -> str:
    tr, best = d["traffic"], d["gap"]["best_causal"]
    if "offline_bytes_per_token" in tr:
        return (f"{tr['offline_bytes_per_token']:.4g} offline, {tr['causal_bytes_per_token']:.4g} best causal ({best})"
                + (" (projection)" if tr.get("projection") else ""))
    return (f"{tr['blocks_per_token_causal']:.4g} blocks per output token best causal ({best}), "
            f"{tr['blocks_per_token_offline']:.4g} offline; bytes not reported (no block size: pass --block-bytes)")


def _conformance(d: dict[str, Any]) -> str:
    cf = d["conformance"]
    got = ", ".join(f"{h} hits / {m} misses {sem}" for sem, (h, m) in cf["measured"].items())
    return (f"yes (expertcache conformance, run by this report: {got})" if cf["passed"]
            else f"FAILED (expertcache conformance, run by this report: {got}; expected {cf['expected']})")


def _appendix_b(d: dict[str, Any], c: ReportConfig) -> tuple[str, dict[str, dict[str, str]]]:
    """The minimal reporting block of Appendix B.1, filled from the measurements and the manifest."""
    w, rg, gp = d["declared_workload"], d["regime"], d["gap"]
    shape = d["shape"]
    seeds = ",".join(str(s) for s in gp["seeds"])
    rows = [
        ("Execution model", None),
        ("event unit", "(step, layer) union"),
        ("retention decision", "event boundary"),
        ("intra-event order (if immediate)", "n/a"),
        ("conformance trace", _conformance(d)),
        ("Workload", None),
        ("templates per category", _fmt(w["templates_per_category"])),
        ("distinct prompt heads / finals", f"{_fmt(w['distinct_prompt_heads'])} / {_fmt(w['distinct_final_lines'])}"),
        ("chat template applied", _fmt(w["chat_template_applied"])),
        ("decode steps recorded", _fmt(d["decode_steps_recorded"])),
        ("position-locked cohorts", _fmt(w["position_locked_cohorts"])),
        ("unique generated sequences", _fmt(w["unique_generated_sequences"])),
        ("positional token agreement", _fmt(w["positional_token_agreement"])),
        ("expert Jaccard | low-text-overlap", _fmt(w["expert_jaccard_low_text_overlap"])),
        ("effect stable across position bands", _fmt(w["effect_stable_across_position_bands"])),
        ("matched-pair attribution (B8)", _fmt(w.get("matched_pair_attribution", NOT_REPORTED))),
        ("Regime", None),
        ("experts N, top-k, layers", f"{shape['n_experts']} / {shape['top_k']} / {shape['n_layers']}"
         + (f" ({d['shape_caveat']})" if d.get("shape_caveat") else "")),
        ("residency fraction rho", f"{c.rho:g}"),
        ("cache scope", c.scope),
        ("union per layer-step", f"mean {rg['union_mean']:.2f}, p95 {rg['union_p95']:g} (nearest rank)"),
        ("capacity per layer", _capacity(d, c)),
        ("r(s,l) = union / capacity", f"mean {rg['r_mean']:.3f}, p95 {rg['r_p95']:.3f}, "
                                      f"fraction > 1 {rg['r_fraction_over_1']:.2%}"),
        ("concurrency", _concurrency(d)),
        ("service discipline", "continuous" if d["service"]["discipline"] == "fcfs-continuous-batching"
         else _fmt(d["service"]["discipline"])),
        ("miss denominator", "pre-dedup"),
        ("dedup credited to policy", "no"),
        ("static fit source", "same trace (static-same-trace diagnostic)"),
        ("static quota rule", "floor(rho*L*N + 0.5) blocks, total // L per layer, +1 for the first total % L"),
        ("initial pinned load counted", "yes"),
        ("Oracle", None),
        ("offline bound reported", f"yes (Belady m = {gp['miss_fraction']['belady']:.2%}; "
                                   f"gap {_fmt(gp['gap'], True)} vs {gp['best_causal']}, the best of "
                                   f"{'/'.join(CAUSAL_POLICIES)}; mean of tie seeds {seeds})"),
        ("forced-admission decomposition", f"{_fmt(gp['admission_share'], True)} / "
                                           f"{_fmt(gp['future_victim_share'], True)}"),
        ("absolute bytes per output token", _bytes(d)),
        ("bandwidth budget assumed", _budget(d, c)),
    ]
    out = []
    structured: dict[str, dict[str, str]] = {}
    section = ""
    for name, value in rows:
        if value is None:
            out.append(name)
            section = name
            structured[section] = {}
        else:
            out.append(f"  {name} {'.' * max(3, 40 - len(name))} {value}")
            structured[section][name] = value
    return "\n".join(out) + "\n", structured
