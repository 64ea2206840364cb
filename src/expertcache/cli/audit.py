"""``expertcache audit``: workload-contamination audit of a trace (route-side) or probe set (prompt-side)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from .main import _console, _echo_json, _guard, _progress, _require_new


def _is_trace(path: str) -> bool:
    """A directory with a manifest and no ``probes.jsonl`` is read as a trace (so a bad one says why)."""
    from ..probes.builder import PROBES_FILE

    manifest = Path(path) / "manifest.json"
    if not manifest.is_file():
        return False
    try:
        if json.loads(manifest.read_text()).get("kind") == "routing_trace":
            return True
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        pass
    return not (Path(path) / PROBES_FILE).is_file()


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.2%}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


@click.command("audit")
@click.argument("path", type=click.Path())
@click.option("--labels", type=click.Path(dir_okay=False), default=None,
              help="Categories: CSV request_id,category[,arm,source_id] or JSON Lines (default: the trace's own).")
@click.option("--prompts", type=click.Path(), default=None,
              help="Also audit these prompts (probe-set directory or JSON Lines) next to a trace.")
@click.option("--bands", default="0:16,16:64,64:", show_default=True,
              help="Decode-index bands START:STOP (empty STOP: to the end).")
@click.option("--cohort", "cohort_size", type=int, default=8, show_default=True,
              help="Requests per position-aligned cohort (decay, matched pairs).")
@click.option("--low-agreement", type=float, default=0.05, show_default=True,
              help="Pairs below this positional agreement are low-text-overlap.")
@click.option("--prefix-agreement", type=float, default=0.25, show_default=True,
              help="Band agreement at which a shared generated prefix occupies the band.")
@click.option("--decay-margin", type=float, default=0.05, show_default=True,
              help="Excess of the prefix-band reduction over other bands that flags a category.")
@click.option("--max-pairs", type=int, default=20000, show_default=True, help="Pair budget (seeded sample above).")
@click.option("--locality/--no-locality", default=True, show_default=True,
              help="Measure workload locality against size-matched reference draws (replays).")
@click.option("--batch", "-B", type=int, default=8, show_default=True, help="Concurrency of the locality streams.")
@click.option("--offsets", default="zero", show_default=True, help="Arrival offsets: zero, stagger:D, random:LO:HI.")
@click.option("--policy", default="lru", show_default=True, help="Replay policy of the locality streams.")
@click.option("--rho", type=float, default=0.4, show_default=True, help="Residency fraction of the locality replays.")
@click.option("--per-draw", type=int, default=None, help="Requests per locality draw (default: min(12, smallest/2)).")
@click.option("--reference-draws", type=int, default=7, show_default=True, help="Size-matched mixed draws.")
@click.option("--category-draws", type=int, default=2, show_default=True,
              help="Disjoint homogeneous draws per category.")
@click.option("--alpha", type=float, default=0.05, show_default=True,
              help="Two-sided level of the locality verdict's t test.")
@click.option("--control", "control_positions", type=int, default=0, show_default=True,
              help="Also run the synthetic positive control copying this many positions (0: off).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("-o", "--out", type=click.Path(dir_okay=False), default=None, help="Write the audit as a JSON file.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output file.")
@click.option("--json", "as_json", is_flag=True, help="Print the audit as one JSON object.")
@_guard
def audit(path: str, labels: str | None, prompts: str | None, bands: str, cohort_size: int, low_agreement: float,
          prefix_agreement: float, decay_margin: float, max_pairs: int, locality: bool, batch: int, offsets: str,
          policy: str, rho: float, per_draw: int | None, reference_draws: int, category_draws: int, alpha: float,
          control_positions: int, seed: int,
          out: str | None, overwrite: bool, as_json: bool) -> None:
    """Audit PATH for workload contamination (§5, B1-B8).

    PATH is a trace directory (route-side: agreement, unique sequences, expert
    Jaccard against a cross-category baseline, prefix-aligned decay and its
    flag, matched-pair attribution when the labels carry arms, workload
    locality against size-matched draws) or a probe set / prompts file
    (prompt-side, B1).
    """
    from ..audit import LocalityConfig, RouteAuditConfig, parse_bands
    from ..events import ArrivalOffsets

    if out:
        _require_new(out, overwrite, file=True)
        _check_out(out)
    route_cfg = RouteAuditConfig(bands=parse_bands(bands), cohort_size=cohort_size, low_agreement=low_agreement,
                                 prefix_agreement=prefix_agreement, decay_margin=decay_margin, max_pairs=max_pairs,
                                 seed=seed)
    offs = ArrivalOffsets.parse(offsets, seed=seed)
    loc_cfg = LocalityConfig(batch=batch, offsets=offs, policy=policy, rho=rho, per_draw=per_draw,
                             n_reference_draws=reference_draws, n_category_draws=category_draws, alpha=alpha,
                             seed=seed) if locality else None
    if control_positions < 0:
        raise click.BadParameter(f"must be >= 0; got {control_positions}", param_hint="--control")
    result = run_audit(path, labels, prompts, route_cfg, loc_cfg, offs, control_positions)
    if out:
        _write_json(out, result)
    if as_json:
        _echo_json(result)
        return
    _print(result)
    if out:
        click.echo(f"wrote {out}")


def run_audit(path: str, labels: str | None, prompts: str | None, route_cfg, loc_cfg, offsets,
              control_positions: int) -> dict[str, Any]:
    """Everything the command measures, as one JSON-ready dict."""
    from ..audit import (
        matched_attribution,
        positive_control,
        read_arms,
        route_audit,
        workload_block,
        workload_locality,
    )
    from ..probes import prompt_diagnostics, read_prompts
    from ..trace import read_trace

    result: dict[str, Any] = {"kind": "workload_audit", "path": path}
    prompt_rows = None
    if not _is_trace(path):
        if labels or prompts:
            raise click.UsageError("--labels and --prompts apply to a trace directory; "
                                   f"{path} is not one (it is audited as prompts)")
        prompt_rows = prompt_diagnostics(read_prompts(path))
        result["prompt"] = [r.to_dict() for r in prompt_rows]
        result["workload_block"] = workload_block(prompts=prompt_rows)
        return result
    if prompts:
        prompt_rows = prompt_diagnostics(read_prompts(prompts))
        result["prompt"] = [r.to_dict() for r in prompt_rows]
    trace = read_trace(path)
    arms = read_arms(labels) if labels else None
    exclude = arms.fixed_mask(trace) if arms else None
    route = route_audit(trace, labels, route_cfg, exclude)
    result["route"] = route.to_dict()
    if arms and exclude.any():
        result["matched"] = matched_attribution(trace, labels, arms, route_cfg, loc_cfg).to_dict()
    elif arms:
        result["matched_note"] = ("the labels carry arms but no request of the trace is in the fixed arm: "
                                  "matched-pair attribution (B8) skipped; collect the probe set's fixed arm too")
    if loc_cfg is not None:
        with _progress() as bar:
            task = bar.add_task("locality", total=None)
            loc = workload_locality(trace, labels, loc_cfg, exclude,
                                    progress=lambda d, t: bar.update(task, completed=d, total=t))
        result["locality"] = loc.to_dict()
    if control_positions:
        result["control"] = positive_control(trace, labels, control_positions, route_cfg, exclude=exclude,
                                             natural=route).to_dict()
    result["workload_block"] = workload_block(trace, labels, route=route, prompts=prompt_rows, offsets=offsets,
                                              config=route_cfg)
    return result


def _check_out(out: str) -> None:
    """Refuse an output path that cannot be written as a file, before any work."""
    from ..errors import ValidationError

    target = Path(out)
    if target.is_dir():
        raise ValidationError(f"{out}: is a directory; -o takes a JSON file path")
    for parent in target.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValidationError(f"{parent}: not a directory; -o needs a path inside a directory")
            break


def _write_json(out: str, result: dict[str, Any]) -> None:
    from ..storage import atomic_write_bytes, json_text

    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(target, (json_text(result, indent=2) + "\n").encode())


def _print(result: dict[str, Any]) -> None:
    from rich.table import Table

    from ..probes import PromptStats
    from .probe import print_prompt_table

    console = _console()
    if "prompt" in result:
        print_prompt_table([PromptStats(**r) for r in result["prompt"]])
    route = result.get("route")
    if route:
        console.print(f"positional agreement compares {route['basis']}; {route['n_requests']} requests, "
                      f"cohorts of {route['cohort_size']}" + (" (pairs sampled)" if route["sampled"] else ""))
        table = Table(title="route-side diagnostics (B5-B7, §5.3-§5.4)")
        cols = ["category", "n", "unique", "agr mean", "agr p95", "expJac", "expJac|lowTok", "residual"]
        cols += [f"red {b}" for b in route["bands"]] + ["prefix bands", "flag", "stable"]
        for col in cols:
            table.add_column(col, justify="left" if col in ("category", "prefix bands") else "right")
        for c in route["categories"]:
            table.add_row(c["category"], str(c["n_requests"]), str(c["unique_sequences"]), _pct(c["agreement_mean"]),
                          _pct(c["agreement_p95"]), _num(c["jaccard_all"]), _num(c["jaccard_low"]),
                          _num(c["residual"]), *[_pct(x) for x in c["band_reduction"]],
                          ", ".join(c["prefix_bands"]) or "-", "YES" if c["flagged"] else "no",
                          "yes" if c["stable"] else "no")
        console.print(table)
        console.print(f"cross-category baseline expJac: {_num(route['baseline_all'])} "
                      f"(low-text-overlap pairs: {_num(route['baseline_low'])}); pooled agreement mean "
                      f"{_pct(route['overall_agreement_mean'])}, p95 {_pct(route['overall_agreement_p95'])}")
        console.print(f"shared generated prefix: {'YES' if route['flag'] else 'no'}; effect in a shared-prefix band "
                      f"(treat as surface repetition): {', '.join(route['flagged_categories']) or 'none'}")
    matched = result.get("matched")
    if matched:
        table = Table(title="matched-pair attribution: fixed arm minus diverse arm (B8, §5.5)")
        table.add_column("category")
        table.add_column("matched", justify="right")
        for b in matched["bands"]:
            table.add_column(f"{b}", justify="right")
        for r in matched["rows"]:
            table.add_row(r["category"], str(r["n_matched"]), *[_pct(x) for x in r["attributable"]])
        console.print(table)
        if matched["miss_fraction_fixed"] is not None:
            console.print(f"end-to-end m of the matched streams: fixed arm {matched['miss_fraction_fixed']:.2%}, "
                          f"diverse arm {matched['miss_fraction_diverse']:.2%} (not a template-echo measure, §5.5)")
    if result.get("matched_note"):
        console.print(result["matched_note"])
    loc = result.get("locality")
    if loc:
        table = Table(title=f"workload locality vs size-matched reference (§5.7): reference m "
                            f"{loc['reference_mean']:.2%} ± {loc['reference_sd']:.2%} over "
                            f"{len(loc['reference_miss_fractions'])} draws of {loc['per_draw']}")
        for col in ("category", "draws m", "mean m", "improvement", "±1 s.d. of reference", "t (df)", "p",
                    "verdict"):
            table.add_column(col, justify="left" if col in ("category", "verdict", "draws m") else "right")
        for c in loc["categories"]:
            table.add_row(c["category"], ", ".join(f"{m:.2%}" for m in c["miss_fractions"]), f"{c['miss_mean']:.2%}",
                          f"{c['improvement']:.1%}", f"{c['interval_low']:.1%} - {c['interval_high']:.1%}",
                          f"{c['t']:.2f} ({c['df']})", f"{c['p_value']:.3f}", c["verdict"])
        console.print(table)
        console.print(loc["statement"] + f" (two-sided t test at alpha {loc['config']['alpha']})")
        echo = [c for c in loc["separated"] if route and c in route["flagged_categories"]]
        if echo:
            console.print(f"caution: {', '.join(echo)} also show their union effect in a shared-prefix band; treat "
                          "their separation as surface repetition until a diverse or matched control says otherwise")
    ctl = result.get("control")
    if ctl:
        console.print(f"positive control ({ctl['copied_positions']} positions of {ctl['source_request']} copied into "
                      f"every record): agreement {_pct(ctl['natural_agreement_mean'])} -> "
                      f"{_pct(ctl['injected_agreement_mean'])}, expJac {_num(ctl['natural_jaccard'])} -> "
                      f"{_num(ctl['injected_jaccard'])}, flag {ctl['natural_flag']} -> {ctl['injected_flag']}"
                      f" ({'flipped' if ctl['flipped'] else 'NOT flipped'})")
    block = result.get("workload_block")
    if block:
        console.print("Workload (reporting block, Appendix B.1)")
        for k, v in block.items():
            name = k.replace("_", " ")
            console.print(f"  {name} {'.' * max(3, 40 - len(name))} {v}", highlight=False)
