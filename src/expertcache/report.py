"""The honest report: every number the checklist asks for, from one command (§10, Appendix B).

``build_report`` measures a trace or stream; ``write_report`` writes a
self-contained directory: ``report.md`` (the Appendix B.1 block, tables and
figures), ``report.json`` (every figure), ``block.txt`` and ``figures/``
(PNG and SVG). Fields that were neither measured nor declared in the input's
manifest say "not reported" — never silently missing.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .analysis import (
    REFERENCE_FRAME,
    access_histogram,
    access_share_table,
    concentration,
    gap_decomposition,
    gate_mass_by_rank,
    permutation_ablation,
    regime_stats,
    traffic_reading,
)
from .analysis.alignment import reference_frame_r_null
from .analysis.concentration import selection_counts
from .errors import ValidationError
from .events import ArrivalOffsets, EventStream, build_events, read_events
from .replay import ReplayConfig, policy_names, replay_curve, sweep
from .storage import MANIFEST, atomic_directory, sha256_file
from .trace import DECODE, RoutingTrace, read_trace

__all__ = ["ReportConfig", "Report", "build_report", "write_report", "NOT_REPORTED"]

NOT_REPORTED = "not reported"
#: Named block sizes; figures derived from them are labelled analytical projections.
PRESETS = {"frontier-reference": REFERENCE_FRAME}
FIG_SEMANTICS = ("sequential-ascending", "event-atomic")


@dataclass(frozen=True)
class ReportConfig:
    """What the report measures. Every field is written into the report."""

    rho: float = 0.4
    scope: str = "per-layer"
    batch: int = 8
    offsets: str = "zero"
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    rhos: tuple[float, ...] = (0.2, 0.3, 0.4)
    n_permutations: int = 5
    block_bytes: float | None = None
    block_bytes_preset: str | None = None
    target_tokens_per_s: float | None = None
    bandwidth_budget: float | None = None
    nextuse_model: str | None = None
    labels: str | None = None
    prompts: str | None = None
    jobs: int = 1

    def __post_init__(self) -> None:
        ReplayConfig(rho=self.rho, scope=self.scope)
        if self.batch < 1 or any(b < 1 for b in self.batches):
            raise ValidationError("batch sizes must be >= 1", field="batch")
        if not self.seeds:
            raise ValidationError("at least one tie seed is needed", field="seeds")
        for r in self.rhos:
            ReplayConfig(rho=r)
        if self.n_permutations < 0:
            raise ValidationError("n_permutations must be >= 0", field="n_permutations")
        if self.block_bytes_preset not in (None, *PRESETS):
            raise ValidationError(f"unknown block-bytes preset {self.block_bytes_preset!r}; choose from "
                                  f"{', '.join(PRESETS)}", field="block_bytes_preset")
        if self.block_bytes is not None and self.block_bytes <= 0:
            raise ValidationError(f"block bytes must be > 0; got {self.block_bytes}", field="block_bytes")


@dataclass
class Report:
    """Everything measured, as plain data (``data``) plus the figures' source series."""

    data: dict[str, Any]
    block: str
    figures: dict[str, Any] = field(default_factory=dict)


def _input_hashes(path: Path) -> dict[str, Any]:
    manifest = json.loads((path / MANIFEST).read_text())
    return {"manifest_sha256": sha256_file(path / MANIFEST),
            "files": {k: v.get("sha256") for k, v in manifest.get("files", {}).items()}}


def _load(path: Path) -> tuple[RoutingTrace | None, EventStream, dict[str, Any]]:
    manifest = json.loads((path / MANIFEST).read_text()) if (path / MANIFEST).is_file() else {}
    if manifest.get("kind") == "routing_trace":
        return read_trace(path), None, manifest   # stream built later at the configured batch
    return None, read_events(path), manifest


def build_report(source: str | os.PathLike[str], config: ReportConfig = ReportConfig(),
                 command: str | None = None) -> Report:
    """Measure ``source`` (a trace or stream directory) as ``config`` says."""
    path = Path(source)
    if not (path / MANIFEST).is_file():
        read_events(path)  # raises the standard "not a directory written by expertcache" error
    trace, stream, manifest = _load(path)
    prov = manifest.get("provenance", {})
    if trace is not None:
        stream = build_events(trace, config.batch, ArrivalOffsets.parse(config.offsets))
    L, N, k = stream.n_layers, stream.n_experts, stream.top_k
    rho, scope = config.rho, config.scope

    regime = regime_stats(stream, rho, scope)
    configs = [ReplayConfig(p, rho=rho, scope=scope, semantics=s, seed=config.seeds[0])
               for p in policy_names(advice=False) if p != "static" for s in FIG_SEMANTICS]
    results = sweep(stream, configs, jobs=config.jobs)
    fig1 = {(r.policy, r.semantics): r.miss_fraction for r in results}
    gap = gap_decomposition(stream, rho, scope, seeds=config.seeds, jobs=config.jobs)
    perm = (permutation_ablation(stream, config.n_permutations, seed=0, rho=rho, scope=scope,
                                 tie_seeds=config.seeds[:1], jobs=config.jobs)
            if config.n_permutations else None)
    hist = access_histogram(stream)
    shares = access_share_table(hist)
    conc = concentration(selection_counts(trace if trace is not None else stream), k)
    gates = gate_mass_by_rank(trace) if trace is not None else None
    best = gap.best_causal
    by_policy = {(r.policy, r.semantics): r for r in results}
    # block bytes: given, else declared in the input's manifest (e.g. by collection), else a named preset
    source_of_bytes = "given"
    block_bytes = config.block_bytes
    declared_bytes = prov.get("expert_block_bytes") or prov.get("trace_provenance", {}).get("expert_block_bytes")
    if block_bytes is None and declared_bytes:
        block_bytes, source_of_bytes = float(declared_bytes), "input manifest (expert_block_bytes)"
    projection = False
    if block_bytes is None and config.block_bytes_preset:
        block_bytes = PRESETS[config.block_bytes_preset].block_bytes
        source_of_bytes, projection = f"preset {config.block_bytes_preset} (analytical projection)", True
    traffic = traffic_reading(stream, by_policy[(best, "event-atomic")].transferred,
                              by_policy[("belady", "event-atomic")].transferred,
                              block_bytes if block_bytes else 1.0, gap.gap,
                              config.target_tokens_per_s, config.bandwidth_budget, projection=projection)
    curve_grid = [round(0.05 * i, 2) for i in range(1, 20)]
    curves = {p: [(c.rho, c.miss_fraction) for c in replay_curve(
        stream, ReplayConfig(p, scope=scope, seed=config.seeds[0]), curve_grid)] for p in ("lru", "belady")}
    rho_sweep = []
    for r in config.rhos:
        g = gap_decomposition(stream, r, scope, seeds=config.seeds[:1], jobs=config.jobs)
        rho_sweep.append({"rho": r, "r_mean": regime_stats(stream, r, scope).r_mean, "gap": g.gap,
                          "best_causal": g.best_causal, "belady": g.miss_fraction["belady"],
                          "best_causal_miss": g.miss_fraction[g.best_causal]})
    batch_sweep = []
    if trace is not None:
        for b in config.batches:
            sb = build_events(trace, b, ArrivalOffsets.parse(config.offsets))
            g = gap_decomposition(sb, rho, scope, seeds=config.seeds[:1], jobs=config.jobs)
            rs = regime_stats(sb, rho, scope)
            batch_sweep.append({"batch": b, "union_mean": rs.union_mean, "union_p95": rs.union_p95,
                                "r_mean": rs.r_mean, "fraction_over_1": rs.r_fraction_over_1, "gap": g.gap,
                                "best_causal": g.best_causal})
    ratio = stream.event_size / np.maximum(regime.capacity_mean, 1e-12) if scope == "global" else \
        stream.event_size / np.maximum(np.asarray(regime.capacity_per_layer)[stream.layer], 1e-12)
    decode_steps = (int(np.max(np.bincount(trace.request[trace.phase == DECODE])))
                    if trace is not None and (trace.phase == DECODE).any() else None)
    declared = {key: prov.get(key, NOT_REPORTED) for key in
                ("chat_template_applied", "templates_per_category", "distinct_prompt_heads", "distinct_final_lines",
                 "position_locked_cohorts", "unique_generated_sequences", "positional_token_agreement",
                 "expert_jaccard_low_text_overlap", "effect_stable_across_position_bands")}
    if trace is not None:   # measured, not declared: the §5 diagnostics (B1, B5-B7) of expertcache.audit
        from .audit import workload_block

        prompt_stats = None
        if config.prompts:
            from .probes import prompt_diagnostics, read_prompts

            prompt_stats = prompt_diagnostics(read_prompts(config.prompts))
        measured = workload_block(trace, config.labels, prompts=prompt_stats,
                                  offsets=ArrivalOffsets.parse(config.offsets))
        declared.update({key: v for key, v in measured.items() if key in declared and v != NOT_REPORTED})
    data = {
        "tool_version": __version__,
        "command": command or " ".join(sys.argv),
        "input": {"path": str(path), "kind": manifest.get("kind"), **_input_hashes(path),
                  "provenance": prov},
        "config": {**{k_: getattr(config, k_) for k_ in config.__dataclass_fields__}},
        "shape": {"n_layers": L, "n_experts": N, "top_k": k, "n_events": stream.n_events,
                  "union": stream.union, "logical": stream.logical,
                  "union_over_logical": stream.union / stream.logical},
        "service": {"discipline": stream.provenance.get("discipline", NOT_REPORTED),
                    "batch": stream.provenance.get("batch", NOT_REPORTED),
                    "offsets": stream.provenance.get("offsets", NOT_REPORTED)},
        "regime": regime.to_dict(),
        "policy_by_semantics": [{"policy": p, "semantics": s, "miss_fraction": m} for (p, s), m in fig1.items()],
        "gap": gap.to_dict(),
        "permutation": perm.to_dict() if perm else NOT_REPORTED,
        "static_access_share": shares,
        "concentration": conc.to_dict(),
        "gate_mass_by_rank": gates.tolist() if gates is not None else NOT_REPORTED,
        "traffic": {**traffic.to_dict(), "block_bytes_source": source_of_bytes}
        if block_bytes else {"blocks_per_token_causal": traffic.causal_blocks_per_token,
                                    "blocks_per_token_offline": traffic.offline_blocks_per_token,
                                    "output_tokens": traffic.output_tokens,
                                    "bytes_per_token": NOT_REPORTED + " (pass --block-bytes)",
                                    "cell": traffic.cell},
        "rho_sweep": rho_sweep,
        "batch_sweep": batch_sweep or NOT_REPORTED + " (needs a trace, not a stream)",
        "curves": {p: [{"rho": r, "miss_fraction": m} for r, m in v] for p, v in curves.items()},
        "decode_steps_recorded": decode_steps if decode_steps is not None else NOT_REPORTED,
        "declared_workload": declared,
        "reference_frame_projection": {
            "note": "analytical projection from the §3.2 specification, not a measurement",
            "r_mean_uniform_null": reference_frame_r_null(int(stream.provenance.get("batch", config.batch)), rho)},
        "synthetic_input": bool(prov.get("synthetic") or prov.get("trace_provenance", {}).get("synthetic")),
    }
    data["nextuse"] = _nextuse_section(stream, config) if config.nextuse_model else NOT_REPORTED
    block, block_fields = _appendix_b(data, config)
    data["reporting_block"] = block_fields
    figures = {"fig1": fig1, "batch_sweep": batch_sweep, "rho_sweep": rho_sweep, "gap": gap, "perm": perm,
               "curves": curves, "ratio": ratio}
    return Report(data, block, figures)


def _nextuse_section(stream: EventStream, config: ReportConfig) -> dict[str, Any]:
    """Table 15 and Table 16 shapes for a predictor fitted elsewhere (a disjoint stream)."""
    from .analysis.gap import CAUSAL_POLICIES
    from .nextuse import access_features, advice_from_predictions, load_predictor, transfer_r2
    from .nextuse.victims import record_decisions, score_decisions
    from .replay import replay

    model = load_predictor(config.nextuse_model)
    f = access_features(stream)
    advice = advice_from_predictions(f, model.predict(f.X), {"model": config.nextuse_model})
    seed = config.seeds[0]
    miss = {p: replay(stream, ReplayConfig(p, rho=config.rho, scope=config.scope, seed=seed)).miss_fraction
            for p in (*CAUSAL_POLICIES, "belady")}
    miss["predicted-next-use"] = replay(stream, ReplayConfig("predicted-next-use", rho=config.rho,
                                                             scope=config.scope, seed=seed), advice=advice).miss_fraction
    best = min(CAUSAL_POLICIES, key=lambda p: (miss[p], p))
    gap = miss[best] - miss["belady"]
    victims = score_decisions(record_decisions(stream, advice, config.rho, config.scope, seed), 300, seed)
    return {"model": config.nextuse_model, "model_sha256": sha256_file(Path(config.nextuse_model)),
            "transfer_r2": transfer_r2(model, f), "miss_fraction": miss, "best_causal": best,
            "fraction_of_gap_recovered": (miss[best] - miss["predicted-next-use"]) / gap if gap > 0 else None,
            "victims": victims.to_dict()}


def _fmt(x: Any, pct: bool = False) -> str:
    if x is None:
        return NOT_REPORTED
    if isinstance(x, str):
        return x
    if isinstance(x, float):
        return f"{x:.2%}" if pct else f"{x:.4g}"
    return str(x)


def _appendix_b(d: dict[str, Any], c: ReportConfig) -> tuple[str, dict[str, dict[str, str]]]:
    """The minimal reporting block of Appendix B.1, filled from the measurements and the manifest."""
    w, rg, gp, tr = d["declared_workload"], d["regime"], d["gap"], d["traffic"]
    rows = [
        ("Execution model", None),
        ("event unit", "(step, layer) union"),
        ("retention decision", "event boundary"),
        ("intra-event order (if immediate)", "n/a"),
        ("conformance trace", "yes (expertcache conformance: 12 hits / 18 misses)"),
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
        ("Regime", None),
        ("experts N, top-k, layers", f"{d['shape']['n_experts']} / {d['shape']['top_k']} / {d['shape']['n_layers']}"),
        ("residency fraction rho", f"{c.rho:g}"),
        ("cache scope", c.scope),
        ("union per layer-step", f"mean {rg['union_mean']:.2f}, p95 {rg['union_p95']:.0f}"),
        ("capacity per layer", f"{rg['capacity_mean']:.2f}"),
        ("r(s,l) = union / capacity", f"mean {rg['r_mean']:.3f}, p95 {rg['r_p95']:.3f}, "
                                      f"fraction > 1 {rg['r_fraction_over_1']:.2%}"),
        ("concurrency", f"B = {_fmt(d['service']['batch'])}"),
        ("service discipline", "continuous" if d["service"]["discipline"] == "fcfs-continuous-batching"
         else _fmt(d["service"]["discipline"])),
        ("miss denominator", "pre-dedup"),
        ("dedup credited to policy", "no"),
        ("static fit source", "same trace (static-same-trace diagnostic)"),
        ("static quota rule", "floor(rho*L*N + 0.5) blocks, total // L per layer, +1 for the first total % L"),
        ("initial pinned load counted", "yes"),
        ("Oracle", None),
        ("offline bound reported", f"yes (Belady m = {gp['miss_fraction']['belady']:.2%}; "
                                   f"gap {_fmt(gp['gap'], True)} vs {gp['best_causal']})"),
        ("forced-admission decomposition", f"{_fmt(gp['admission_share'], True)} / "
                                           f"{_fmt(gp['future_victim_share'], True)}"),
        ("absolute bytes per output token",
         f"{tr['offline_bytes_per_token']:.4g} offline, {tr['causal_bytes_per_token']:.4g} best causal"
         + (" (projection)" if tr.get("projection") else "") if "offline_bytes_per_token" in tr
         else NOT_REPORTED + " (pass --block-bytes)"),
        ("bandwidth budget assumed", f"{c.bandwidth_budget:g} B/s at {c.target_tokens_per_s:g} tokens/s"
         if c.bandwidth_budget and c.target_tokens_per_s else NOT_REPORTED),
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


def _figures(report: Report, out: Path) -> list[str]:
    from .plot import _pyplot

    plt = _pyplot()
    f = report.figures
    names = []

    def save(fig, name):
        for ext in ("png", "svg"):
            fig.savefig(out / f"{name}.{ext}", dpi=130)
        plt.close(fig)
        names.append(name)

    # Fig. 1 shape: policy x replay semantics
    pols = [p for p in policy_names(advice=False) if p != "static"]
    fig, ax = plt.subplots(figsize=(8, 4), layout="constrained")
    x = np.arange(len(pols))
    for j, sem in enumerate(FIG_SEMANTICS):
        ax.bar(x + (j - 0.5) * 0.38, [f["fig1"][(p, sem)] * 100 for p in pols], 0.38, label=sem)
    ax.set_xticks(x, pols, rotation=30, ha="right")
    ax.set_ylabel("effective miss fraction M / logical (%)")
    ax.set_title("Replay semantics changes policies selectively (Fig. 1 shape)")
    ax.legend()
    save(fig, "policy_by_semantics")
    # gap and r_bar versus B and rho
    for key, xlab, name in (("batch_sweep", "concurrency B", "gap_vs_batch"), ("rho_sweep", "residency rho",
                                                                               "gap_vs_rho")):
        rows = f[key]
        if not rows:
            continue
        xs = [r["batch" if key == "batch_sweep" else "rho"] for r in rows]
        fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
        ax.plot(xs, [(r["gap"] or 0) * 100 for r in rows], "o-", label="recoverable gap (%)")
        ax.set_xlabel(xlab)
        ax.set_ylabel("recoverable gap (%)")
        ax2 = ax.twinx()
        ax2.plot(xs, [r["r_mean"] for r in rows], "s--", color="tab:red", label="mean r(s,l)")
        ax2.axhline(1.0, color="tab:red", lw=0.8, alpha=0.5)
        ax2.set_ylabel("mean r(s,l) = union / capacity")
        ax.set_title(f"Gap and regime versus {xlab}")
        save(fig, name)
    # decomposition bars (Fig. 4 shape)
    g = f["gap"]
    fig, ax = plt.subplots(figsize=(5, 4), layout="constrained")
    ax.bar(["admission", "future victim"], [(g.admission_share or 0) * 100, (g.future_victim_share or 0) * 100],
           color=["tab:blue", "tab:orange"])
    ax.set_ylabel("share of the recoverable gap (%)")
    ax.set_title(f"Gap {_fmt(g.gap, True)} vs {g.best_causal}: decomposition")
    save(fig, "gap_decomposition")
    # permutation ablation (Fig. 3 shape)
    if f["perm"] is not None:
        p = f["perm"]
        fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
        ax.axhline((p.original_gap or 0) * 100, color="black", label=f"original order ({p.original_best_causal})")
        ax.plot(range(1, len(p.permuted_gaps) + 1), [(x or 0) * 100 for x in p.permuted_gaps], "o",
                label="step permutations")
        ax.set_xlabel("permutation")
        ax.set_ylabel("recoverable gap (%)")
        ax.set_title("Same events, same mean r: only temporal order changes (§6.5)")
        ax.legend()
        save(fig, "permutation_ablation")
    # miss-ratio curves
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    for pol, pts in f["curves"].items():
        ax.plot([r for r, _ in pts], [m * 100 for _, m in pts], "o-", ms=3, label=pol)
    ax.set_xlabel("residency fraction rho")
    ax.set_ylabel("effective miss fraction (%)")
    ax.set_title("Miss-ratio curves (event-atomic)")
    ax.legend()
    save(fig, "miss_ratio_curves")
    # r(s,l) histogram
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    ax.hist(f["ratio"], bins=40)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xlabel("r(s,l) = |E(s,l)| / c_l")
    ax.set_ylabel("events")
    ax.set_title("Event ratio distribution (§6.1)")
    save(fig, "event_ratio_histogram")
    return names


def _markdown(report: Report, figures: list[str]) -> str:
    d = report.data
    lines = ["# expertcache report", ""]
    if d["synthetic_input"]:
        lines += ["> **Synthetic input**: this trace was generated by `expertcache.synth`, not recorded from a "
                  "model.", ""]
    lines += [f"Produced by expertcache {d['tool_version']} with `{d['command']}`.", "",
              f"Input `{d['input']['path']}` ({d['input']['kind']}), manifest sha256 "
              f"`{d['input']['manifest_sha256']}`; data files: "
              + ", ".join(f"`{k}` sha256 `{v}`" for k, v in d["input"]["files"].items()) + ".", "",
              "## Reporting block (Appendix B.1)", "", "```", report.block.rstrip(), "```", "",
              "## Policies under two replay semantics", "", "| policy | sequential-ascending | event-atomic | inflation |",
              "|---|---|---|---|"]
    fig1 = {(r["policy"], r["semantics"]): r["miss_fraction"] for r in d["policy_by_semantics"]}
    for p in dict.fromkeys(r["policy"] for r in d["policy_by_semantics"]):
        a, e = fig1[(p, "sequential-ascending")], fig1[(p, "event-atomic")]
        lines.append(f"| {p} | {a:.2%} | {e:.2%} | {(a / e - 1) if e else 0:+.1%} |")
    g = d["gap"]
    lines += ["", "## Gap and decomposition (§7.1-§7.2)", "",
              f"Best causal: **{g['best_causal']}**; gap {_fmt(g['gap'], True)}; admission share "
              f"{_fmt(g['admission_share'], True)}, future-victim share {_fmt(g['future_victim_share'], True)}; "
              f"tie seeds {list(g['seeds'])}, gap spread {_fmt(g['gap_spread'])} (implementation stability, "
              "not a confidence interval).", "", "| policy | mean miss fraction |", "|---|---|"]
    lines += [f"| {p} | {m:.2%} |" for p, m in g["miss_fraction"].items()]
    lines += ["", "## Regime sweeps (Tables 9-10 shape)", "", "| rho | mean r | gap | best causal |", "|---|---|---|---|"]
    lines += [f"| {r['rho']:g} | {r['r_mean']:.3f} | {_fmt(r['gap'], True)} | {r['best_causal']} |"
              for r in d["rho_sweep"]]
    if isinstance(d["batch_sweep"], list):
        lines += ["", "| B | union mean | p95 | mean r | fraction > 1 | gap | best causal |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['batch']} | {r['union_mean']:.2f} | {r['union_p95']:.0f} | {r['r_mean']:.3f} | "
                  f"{r['fraction_over_1']:.2%} | {_fmt(r['gap'], True)} | {r['best_causal']} |"
                  for r in d["batch_sweep"]]
    perm = d["permutation"]
    if isinstance(perm, dict):
        lines += ["", "## Permutation ablation (§6.5)", "",
                  f"Original order: gap {_fmt(perm['original_gap'], True)} ({perm['original_best_causal']}); "
                  f"{len(perm['permuted_gaps'])} step permutations (same event multiset, same mean r): gaps "
                  + ", ".join(_fmt(x, True) for x in perm["permuted_gaps"]) + "; best causal "
                  + ", ".join(perm["permuted_best_causal"]) + "."]
    lines += ["", "## Static identity (§9.2)", "", "| top fraction of blocks | share of accesses |", "|---|---|"]
    lines += [f"| {r['fraction_of_blocks']:.0%} | {r['share_of_accesses']:.2%} |" for r in d["static_access_share"]]
    c = d["concentration"]
    lines += ["", "## Concentration (CLR Fig. 2-3) and gate mass by rank (§9.4)", "",
              f"Mean over layers: max expert frequency {c['overall_max_frequency']:.2%}, top-k mass "
              f"{c['overall_topk_mass']:.2%}, entropy {c['overall_entropy']:.3f} nats, effective experts "
              f"{c['overall_effective_experts']:.1f} of {d['shape']['n_experts']}."]
    gm = d["gate_mass_by_rank"]
    lines.append("Gate mass by rank: " + (", ".join(f"{x:.1%}" for x in gm) if isinstance(gm, list) else gm) + ".")
    nu = d["nextuse"]
    if isinstance(nu, dict):
        v = nu["victims"]
        lines += ["", "## Next-use prediction (§7.3; Tables 15-16 shape)", "",
                  f"Model `{nu['model']}` (sha256 `{nu['model_sha256']}`), transfer R2 {nu['transfer_r2']:.3f}; "
                  f"fraction of the gap recovered {_fmt(nu['fraction_of_gap_recovered'], True)} "
                  f"(best causal {nu['best_causal']}).", "", "| policy | miss fraction |", "|---|---|"]
        lines += [f"| {p} | {m:.2%} |" for p, m in nu["miss_fraction"].items()]
        lines += ["", f"{v['n_decisions']} sampled eviction decisions; mean candidate set "
                  f"{v['mean_candidates']:.1f}, mean optimal-victim set {v['mean_optimal_set']:.2f}.", "",
                  "| victim chosen by | in optimal set [95% CI] | distance regret |", "|---|---|---|"]
        lines += [f"| {k} | {m:.2%} [{lo:.2%}, {hi:.2%}] | {v['distance_regret'][k][0]:.5f} |"
                  for k, (m, lo, hi) in v["in_optimal_set"].items()]
    t = d["traffic"]
    lines += ["", "## Absolute traffic (§6.6)", "", "```", json.dumps(t, indent=2, default=str), "```", "",
              "## Figures", ""]
    lines += [f"![{n}](figures/{n}.png)" for n in figures]
    if not figures:
        lines.append(str(d.get("figures", "Figures were not requested (--no-figures).")))
    return "\n".join(lines) + "\n"


def write_report(report: Report, out: str | os.PathLike[str], *, overwrite: bool = False,
                 figures: bool = True) -> Path:
    """Write ``report.md``, ``report.json``, ``block.txt`` and ``figures/`` into ``out`` atomically."""
    if figures:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            figures = False
            report.data["figures"] = NOT_REPORTED + " (matplotlib is not installed: pip install 'expertcache[plot]')"
    with atomic_directory(out, overwrite=overwrite) as tmp:
        names: list[str] = []
        if figures:
            (tmp / "figures").mkdir()
            names = _figures(report, tmp / "figures")
        (tmp / "report.json").write_text(json.dumps(report.data, indent=2, sort_keys=True, default=str) + "\n")
        (tmp / "block.txt").write_text(report.block)
        (tmp / "report.md").write_text(_markdown(report, names))
    return Path(out)
