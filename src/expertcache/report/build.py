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
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..analysis import (
    access_histogram,
    access_share_table,
    concentration,
    gap_decomposition,
    gate_mass_by_rank,
    permutation_ablation,
    regime_stats,
    traffic_reading,
)
from ..analysis.alignment import reference_frame_r_null
from ..analysis.concentration import selection_counts
from ..events import ArrivalOffsets, EventStream, build_events, read_events
from ..replay import ReplayConfig, policy_names, replay_curve, sweep, total_capacity
from ..storage import MANIFEST, atomic_directory, json_text, sha256_file
from ..trace import DECODE, RoutingTrace, read_trace
from ..trace.provenance import import_record, shape_caveat
from .block import NOT_REPORTED, _appendix_b
from .config import PRESETS, Report, ReportConfig
from .figures import FIG_SEMANTICS, _figures
from .tables import _markdown

__all__ = ["ReportConfig", "Report", "build_report", "write_report", "NOT_REPORTED"]

def _input_hashes(path: Path) -> dict[str, Any]:
    manifest = json.loads((path / MANIFEST).read_text())
    return {"manifest_sha256": sha256_file(path / MANIFEST),
            "files": {k: v.get("sha256") for k, v in manifest.get("files", {}).items()}}


def _load(path: Path) -> tuple[RoutingTrace | None, EventStream, dict[str, Any]]:
    manifest = json.loads((path / MANIFEST).read_text()) if (path / MANIFEST).is_file() else {}
    if manifest.get("kind") == "routing_trace":
        return read_trace(path), None, manifest   # stream built later at the configured batch
    return None, read_events(path), manifest


def _occupancy(stream: EventStream) -> dict[str, Any]:
    """Active requests per scheduling step (one count per step, not per event)."""
    _, first = np.unique(stream.step, return_index=True)
    act = stream.active[first]
    return {"max_active": int(act.max()) if act.size else 0, "mean_active": float(act.mean()) if act.size else 0.0,
            "n_steps": int(act.size)}


def _conformance_check() -> dict[str, Any]:
    """Replay the §2.5 conformance trace now, under both semantics, against its hand-derived counts."""
    from dataclasses import replace

    from ..conformance import CONFORMANCE_CONFIG, EXPECTED, conformance_stream
    from ..replay import replay

    stream = conformance_stream()
    measured = {}
    for sem in EXPECTED:
        r = replay(stream, replace(CONFORMANCE_CONFIG, semantics=sem))
        measured[sem] = (r.hits, r.demand_misses)
    return {"measured": measured, "expected": dict(EXPECTED), "passed": measured == dict(EXPECTED)}


def _static_identity(stream: EventStream, hist: np.ndarray, shares: list[dict], scope: str,
                     seed: int) -> list[dict[str, Any]]:
    """§9.2: ``1 - share`` predicted from the histogram against the simulated static-same-trace union miss ratio."""
    from ..replay import replay

    rows = []
    for row in shares:
        f = row["fraction_of_blocks"]
        r = replay(stream, ReplayConfig("static-same-trace", rho=f, scope="per-layer", seed=seed))
        rows.append({**row, "predicted_union_miss_ratio": 1.0 - row["share_of_accesses"],
                     "simulated_union_miss_ratio": r.demand_misses / r.union if r.union else 0.0})
    return rows


def build_report(source: str | os.PathLike[str], config: ReportConfig = ReportConfig(),
                 command: str | None = None) -> Report:
    """Measure ``source`` (a trace or stream directory) as ``config`` says."""
    from ..replay.engine import reuse_belady_inputs

    with reuse_belady_inputs():    # the report replays Belady on its streams under a few tie orders, many times
        return _build_report(source, config, command)


def _build_report(source: str | os.PathLike[str], config: ReportConfig, command: str | None) -> Report:
    path = Path(source)
    if not (path / MANIFEST).is_file():
        read_events(path)  # raises the standard "not a directory written by expertcache" error
    profile = None
    if config.profile is not None:        # before any measuring: a bad profile is a one-line error at once
        from ..timing import load_profile

        profile = load_profile(config.profile)
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
    known = dict(zip(configs, results, strict=True))      # replays of `stream` done: not repeated below
    gap = gap_decomposition(stream, rho, scope, seeds=config.seeds, jobs=config.jobs, known=known)
    perm = (permutation_ablation(stream, config.n_permutations, seed=0, rho=rho, scope=scope,
                                 tie_seeds=config.seeds[:1], jobs=config.jobs)
            if config.n_permutations else None)
    hist = access_histogram(stream)
    shares = _static_identity(stream, hist, access_share_table(hist), scope, config.seeds[0])
    counts = selection_counts(trace if trace is not None else stream)
    conc = concentration(counts, k)
    top8 = concentration(counts, min(8, N)).overall_topk_mass
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
    budget, budget_source = config.bandwidth_budget, "given (--bandwidth)"
    if profile is not None and budget is None:
        budget, budget_source = profile.bandwidth, f"profile {profile.name} ({profile.measured})"
    traffic = traffic_reading(stream, by_policy[(best, "event-atomic")].transferred,
                              by_policy[("belady", "event-atomic")].transferred,
                              block_bytes if block_bytes else 1.0, gap.gap,
                              config.target_tokens_per_s, budget, projection=projection)
    curve_grid = [round(0.05 * i, 2) for i in range(1, 20)]
    curve_policies = tuple(dict.fromkeys(("lru", gap.best_causal, "belady")))   # the best causal policy too
    curves = {p: [(c.rho, c.miss_fraction) for c in replay_curve(
        stream, ReplayConfig(p, scope=scope, seed=config.seeds[0]), curve_grid)] for p in curve_policies}
    rho_sweep = []
    gaps_at: dict[float, Any] = {}          # rho -> the seed-0 gap on `stream` (the batch sweep reuses it)
    for r in config.rhos:
        g = gaps_at[r] = gap_decomposition(stream, r, scope, seeds=config.seeds[:1], jobs=config.jobs,
                                           known=known)
        rho_sweep.append({"rho": r, "r_mean": regime_stats(stream, r, scope).r_mean, "gap": g.gap,
                          "best_causal": g.best_causal, "belady": g.miss_fraction["belady"],
                          "best_causal_miss": g.miss_fraction[g.best_causal]})
    batch_sweep = []
    if trace is not None:
        for b in config.batches:
            # the configured batch is `stream` itself (same trace, batch and offsets): not built or replayed again
            same = b == config.batch
            sb = stream if same else build_events(trace, b, ArrivalOffsets.parse(config.offsets))
            g = gaps_at[rho] if same and rho in gaps_at else gap_decomposition(sb, rho, scope,
                                                                                 seeds=config.seeds[:1],
                                                                                 jobs=config.jobs)
            rs = regime_stats(sb, rho, scope)
            batch_sweep.append({"batch": b, **_occupancy(sb), "union_mean": rs.union_mean, "union_p95": rs.union_p95,
                                "r_mean": rs.r_mean, "fraction_over_1": rs.r_fraction_over_1, "gap": g.gap,
                                "best_causal": g.best_causal})
    ratio = stream.event_size / np.maximum(regime.capacity_mean, 1e-12) if scope == "global" else \
        stream.event_size / np.maximum(np.asarray(regime.capacity_per_layer)[stream.layer], 1e-12)
    decode_steps = (int(np.max(np.bincount(trace.request[trace.phase == DECODE])))
                    if trace is not None and (trace.phase == DECODE).any() else None)
    declared = {key: prov.get(key, NOT_REPORTED) for key in
                ("chat_template_applied", "templates_per_category", "distinct_prompt_heads", "distinct_final_lines",
                 "position_locked_cohorts", "unique_generated_sequences", "positional_token_agreement",
                 "expert_jaccard_low_text_overlap", "effect_stable_across_position_bands",
                 "matched_pair_attribution")}
    if trace is not None:   # measured, not declared: the §5 diagnostics (B1, B5-B7) of expertcache.audit
        from ..audit import workload_block

        prompt_stats = None
        if config.prompts:
            from ..probes import prompt_diagnostics, read_prompts

            prompt_stats = prompt_diagnostics(read_prompts(config.prompts))
        measured = workload_block(trace, config.labels, prompts=prompt_stats,
                                  offsets=ArrivalOffsets.parse(config.offsets), batch=config.batch)
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
                    "offsets": stream.provenance.get("offsets", NOT_REPORTED),
                    "n_requests": stream.provenance.get("n_requests", NOT_REPORTED)},
        "occupancy": _occupancy(stream),
        "capacity": {"total": total_capacity(rho, L, N)},
        "shape_caveat": shape_caveat(prov, N) or shape_caveat(stream.provenance, N),
        "import": dict(import_record(prov) or import_record(stream.provenance)) or NOT_REPORTED,
        "conformance": _conformance_check(),
        "regime": regime.to_dict(),
        "policy_by_semantics": [{"policy": p, "semantics": s, "miss_fraction": m} for (p, s), m in fig1.items()],
        "gap": gap.to_dict(),
        "permutation": perm.to_dict() if perm else NOT_REPORTED,
        "static_access_share": shares,
        "concentration": conc.to_dict(),
        "top8_mass": top8,
        "gate_mass_by_rank": gates.tolist() if gates is not None else NOT_REPORTED,
        "traffic": {**traffic.to_dict(), "block_bytes_source": source_of_bytes,
                    "bandwidth_budget_source": budget_source if budget is not None else NOT_REPORTED}
        if block_bytes else {"blocks_per_token_causal": traffic.causal_blocks_per_token,
                                    "blocks_per_token_offline": traffic.offline_blocks_per_token,
                                    "output_tokens": traffic.output_tokens,
                                    "bytes_per_token": NOT_REPORTED + " (pass --block-bytes)",
                                    "cell": traffic.cell},
        "timing": (_timing_section(stream, config, profile, block_bytes, source_of_bytes, best)
                   if profile is not None else NOT_REPORTED + " (pass --profile)"),
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
               "curves": curves, "ratio": ratio, "event_size": stream.event_size,
               "capacities": (list(regime.capacity_per_layer) if scope != "global"
                              else [total_capacity(rho, L, N) / L])}
    return Report(data, block, figures)


#: Policies of the time section, besides the best causal one.
TIMING_POLICIES = ("lru", "lfu", "static-same-trace", "belady")


def _timing_section(stream: EventStream, config: ReportConfig, profile: Any, block_bytes: float | None,
                    source_of_bytes: str, best: str) -> dict[str, Any] | str:
    """The replays of the report put on a timeline under ``profile`` (fused contract, tie seed ``seeds[0]``)."""
    from ..timing import simulate
    from ..timing.model import recorded_expert_bytes

    if block_bytes:
        nbytes, nbytes_source = int(block_bytes), source_of_bytes
    elif profile.expert_bytes:
        nbytes, nbytes_source = int(profile.expert_bytes), f"profile {profile.name}"
    elif recorded_expert_bytes(stream):
        nbytes, nbytes_source = int(recorded_expert_bytes(stream)), "input (expert_block_bytes)"
    else:
        return NOT_REPORTED + " (the expert block size is unknown: pass --block-bytes)"
    policies = tuple(dict.fromkeys((*TIMING_POLICIES[:2], best, *TIMING_POLICIES[2:])))
    rows = [simulate(stream, ReplayConfig(p, rho=config.rho, scope=config.scope, seed=config.seeds[0]), profile,
                     expert_bytes=nbytes).to_dict() for p in policies]
    return {"profile": {"name": profile.name, "source": profile.source, "measured": profile.measured,
                        "bandwidth": profile.bandwidth, "latency_s": profile.latency_s,
                        "copy_streams": profile.copy_streams, "overlap": profile.overlap},
            "contract": "fused", "expert_bytes": nbytes, "expert_bytes_source": nbytes_source,
            "tie_seed": config.seeds[0], "rows": rows}


def _nextuse_section(stream: EventStream, config: ReportConfig) -> dict[str, Any]:
    """Table 15 and Table 16 shapes for a predictor fitted elsewhere (a disjoint stream)."""
    from ..analysis.gap import CAUSAL_POLICIES
    from ..nextuse import access_features, advice_from_predictions, load_predictor, transfer_r2
    from ..nextuse.victims import record_decisions, score_decisions
    from ..replay import replay

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
        (tmp / "report.json").write_text(json_text(report.data, indent=2) + "\n")
        (tmp / "block.txt").write_text(report.block)
        (tmp / "report.md").write_text(_markdown(report, names))
    return Path(out)
