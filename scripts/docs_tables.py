"""Regenerate the measured tables of docs/ from the commands the docs name.

Each table sits between two markers in its Markdown file::

    <!-- table: NAME -->
    | ... the table ... |
    <!-- /table -->

``python scripts/docs_tables.py`` runs every table's command (on the bundled data, in-process through the
command line) and rewrites the text between the markers; ``--check`` rewrites nothing and exits 1 when a
document differs from what its commands print now (``tests/test_docs_tables.py`` runs the check).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_MODEL = "src/expertcache/data/example_model_trace"
EXAMPLE_PROMPTS = "src/expertcache/data/example_prompts.jsonl"


def _run(args: list[str]) -> dict:
    from click.testing import CliRunner

    from expertcache.cli import main

    res = CliRunner().invoke(main, args)
    if res.exit_code != 0:
        raise SystemExit(f"expertcache {' '.join(args)} failed:\n{res.output}")
    return json.loads(res.output.strip().splitlines()[-1])


def _compare_table(args: list[str], availability: bool) -> str:
    rep = _run(["prefetch", "compare", *args, "--json"])
    rows = [r for r in rep["rows"] if "hit" in r]
    unit = rows[0]["load_unit"]
    mb = unit == "bytes/token"
    head = ["family", "policy", "Hit %", "AdjHit %", "MB/token" if mb else "blocks/token", "P", "m", "added params"]
    if availability:
        head.append("decision availability")
    out = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * 6 + ("---|" if availability else "")]
    for r in rows:
        load = r["load_per_token"] / 1e6 if mb else r["load_per_token"]
        cells = [r["family"], r["name"], f"{100 * r['hit']:.2f}", f"{100 * r['adj_hit']:.2f}", f"{load:.3f}" if mb else f"{load:.2f}",
                 str(r["proactive_loads"]), f"{r['miss_fraction']:.4f}", f"{r['added_params']:,}"]
        if availability:
            cells.append(r["availability"])
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _timed_compare_table(args: list[str]) -> str:
    rep = _run(["prefetch", "compare", *args, "--json"])
    out = ["| policy | issued at | TPOT mean ms | TPOT p99 ms | stall share | D | P | timely | late | useless |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rep["rows"]:
        t = r.get("timing")
        if not t:
            continue
        out.append(f"| {r['name']} | {t['issue'] if t['prefetch_budget'] else '-'} | {t['tpot_mean_s'] * 1e3:.4f} | "
                   f"{t['tpot_p99_s'] * 1e3:.4f} | {t['stall_share']:.2%} | {t['demand_misses']:,} | "
                   f"{t['prefetch_loads']:,} | {t['prefetch_timely']:,} | {t['prefetch_late']:,} | "
                   f"{t['prefetch_useless']:,} |")
    return "\n".join(out)


def _affinity_table(args: list[str]) -> str:
    rep = _run(["affinity", *args, "--json"])
    out = ["| policy | FCFS m | causal m | oracle m | causal gain | oracle gain | share | dp99 (blocks/step) "
           "| latency dp99 |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rep["rows"]:
        share = "n/a" if r["share"] is None else f"{r['share']:.1%}"
        dp = "n/a" if r["delta_p99_causal"] is None else f"{r['delta_p99_causal']:+.2%}"
        out.append(f"| {r['policy']} | {r['fcfs']:.2%} | {r['causal']:.2%} | {r['oracle']:.2%} | "
                   f"{r['causal_gain']:+.2%} | {r['oracle_gain']:+.2%} | {share} | {dp} | "
                   f"{r['delta_latency_p99_causal']:+.2%} |")
    p99 = "; ".join(f"{name}: " + ", ".join(f"{r['policy']} {r['p99_blocks'][name]:g}" for r in rep["rows"])
                    for name in rep["stats"])
    return "\n".join(out) + f"\n\np99 blocks demand-missed per step — {p99}."


ROUTERS_DATA = "docs/data/routers_example.json"


def _routers_data() -> dict:
    return json.loads((ROOT / ROUTERS_DATA).read_text())


def _hit(ev: dict, method: str) -> float:
    return 100 * next(r["hit"] for r in ev["table"] if r["method"] == method)


def _routers_temporal_table() -> str:
    """Hit (%) per capacity, means over the tie seeds (LRU with [min, max]), from scripts/routers_tables.py."""
    d = _routers_data()
    methods = ("LRU", "LFU", "LRFU", "Native p^R (untrained)", "Temporal Router")
    out = ["| B (of 32) | LRU | LFU | LRFU | native `p^R` (router at init) | Temporal Router | Temporal - LRU "
           "| Hit logged at the end of training |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for b in d["capacities"]:
        evals = d["temporal"][str(b)]["evals"]
        per = {m: [_hit(ev, m) for ev in evals] for m in methods}
        mean = {m: sum(v) / len(v) for m, v in per.items()}
        diff = mean["Temporal Router"] - mean["LRU"]
        best = max(("LRU", "LFU", "LRFU"), key=lambda m: mean[m])
        cells = [f"{mean['LRU']:.2f} [{min(per['LRU']):.2f}, {max(per['LRU']):.2f}]"]
        cells += [f"{mean[m]:.2f}" for m in ("LFU", "LRFU", "Native p^R (untrained)")]
        t = f"{mean['Temporal Router']:.2f}"
        cells += [f"**{t}**" if mean["Temporal Router"] > mean[best] else t, f"{diff:+.2f}",
                  f"{d['temporal'][str(b)]['train']['final']['hit'] * 100:.2f} (seed 0)"]
        out.append(f"| {b} | " + " | ".join(cells) + " |")
    spread = max(max(_hit(ev, m) for ev in d["temporal"][str(b)]["evals"]) -
                 min(_hit(ev, m) for ev in d["temporal"][str(b)]["evals"])
                 for b in d["capacities"] for m in methods[1:])
    ev0 = d["temporal"][str(d["capacities"][0])]["evals"][0]
    lru = next(r for r in ev0["table"] if r["method"] == "LRU")
    train = d["temporal"][str(d["capacities"][0])]["train"]
    return "\n".join(out) + (
        f"\n\nHit in %, mean over tie seeds {', '.join(map(str, d['seeds']))} (LRU: [min, max]; the other rows vary "
        f"by at most {spread:.2f} pp across seeds); bold where the Temporal Router is above every classic row. "
        f"Held-out: {lru['tokens']:,} decode tokens, {ev0['scope']['decode_events']:,} decode events, "
        f"A = {lru['accesses']:,} accesses; each checkpoint: {train['steps']} optimizer steps, "
        f"{train['added_parameters']:,} added parameters. The last column is the Hit `routers train "
        f"--eval-trace` logged after the last step. Measured on weights sha256 "
        f"`{d['model_weights_sha256'][:12]}…` (Python {d['python']}, torch {d['torch']}, transformers "
        f"{d['transformers']}, {d['threads']} thread(s)).")


def _routers_budget_table() -> str:
    """The full mode's pre-access budget sweep (B = 8, seed 0) and LRU's load in the same run."""
    d = _routers_data()
    ev = d["full"]["eval"]
    out = ["| R | Hit | AdjHit | Load (MB/token) | P |", "|---:|---:|---:|---:|---:|"]
    for r in ev["budget_sweep"]:
        out.append(f"| {r['budget']} | {100 * r['hit']:.2f} | {100 * r['adj_hit']:.2f} | "
                   f"{r['load_per_token'] / 1e6:.3f} | {r['proactive_loads']:,} |")
    lru = next(r for r in ev["table"] if r["method"] == "LRU")
    temporal = d["temporal"]["8"]["evals"][0]
    t8 = next(r for r in temporal["table"] if r["method"] == "Temporal Router")
    more = all(r["load_per_token"] > lru["load_per_token"] for r in ev["budget_sweep"] if r["budget"] > 0)
    return "\n".join(out) + (
        f"\n\nLRU at `B = 8` in the same run: Hit {100 * lru['hit']:.2f}, {lru['load_per_token'] / 1e6:.3f} MB/token "
        f"({ev['scope']['expert_bytes']:,} bytes per expert block, from the trace's `expert_block_bytes`): "
        f"{'every' if more else 'not every'} budget `R > 0` moves more bytes than plain LRU. The temporal-only "
        f"checkpoint's Temporal Router at `B = 8`, seed 0: Hit {100 * t8['hit']:.2f}.")


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _audit_table(args: list[str]) -> str:
    """The route audit of docs/probes.md: one row per category, then the pooled figures as sentences."""
    rep = _run(["audit", *args, "--json"])
    route, loc, ctl = rep["route"], rep["locality"], rep["control"]
    lo = {c["category"]: c for c in loc["categories"]}
    out = ["| category | unique | agr mean / p95 | expJac / \\|lowTok | residual | red 0-16 / 16-64 | prefix band "
           "| locality: m (2 draws) | t (7 df), p | verdict |", "|---|---|---|---|---:|---|---|---|---|---|"]
    for c in route["categories"]:
        band = ", ".join(c["prefix_bands"]) + (", flagged" if c["flagged"] else "") if c["prefix_bands"] else (
            "– (stable)" if c["stable"] else "–")
        red = c["band_reduction"]
        m = lo[c["category"]]
        verdict = "separated" if m["verdict"] == "separated" else "not distinguishable"
        out.append(f"| {c['category']} | {c['unique_sequences']}/{c['n_requests']} | "
                   f"{_pct(c['agreement_mean'])} / {_pct(c['agreement_p95'])} | {c['jaccard_all']:.3f} / "
                   f"{c['jaccard_low']:.3f} | {c['residual']:+.3f} | {_pct(red[0])} / {_pct(red[1])} | {band} | "
                   f"{', '.join(_pct(x) for x in m['miss_fractions'])} | {m['t']:.2f}, {m['p_value']:.3f} | {verdict} |")
    flagged = route["flagged_categories"]
    return "\n".join(out) + (
        f"\n\nCross-category baseline expert Jaccard {route['baseline_all']:.3f} ({route['baseline_low']:.3f} over "
        f"low-agreement pairs); size-matched reference m = {_pct(loc['reference_mean'])} ± {_pct(loc['reference_sd'])} "
        f"over {len(loc['reference_miss_fractions'])} draws of {loc['per_draw']} requests ({loc['config']['policy'].upper()}, "
        f"ρ = {loc['config']['rho']:g}, B = {loc['config']['batch']}). Shared generated prefix: "
        f"{'yes' if route['shared_prefix'] else 'no'}; flagged categories: {', '.join(flagged) if flagged else 'none'}. "
        f"Positive control ({ctl['copied_positions']} positions of `{ctl['source_request']}` copied into every "
        f"record): agreement {_pct(ctl['natural_agreement_mean'])} → {_pct(ctl['injected_agreement_mean'])}, "
        f"expert Jaccard {ctl['natural_jaccard']:.3f} → {ctl['injected_jaccard']:.3f}, flag "
        f"{str(ctl['natural_flag']).lower()} → {str(ctl['injected_flag']).lower()}.")


#: name -> (document, the command the document names, what renders the table)
TABLES: dict[str, tuple[str, str, Callable[[], str]]] = {
    "prefetch-example": ("docs/prefetch.md", "expertcache prefetch compare example",
                         lambda: _compare_table(["example"], True)),
    "prefetch-example-model": ("docs/prefetch.md", f"expertcache prefetch compare {EXAMPLE_MODEL} -C 8",
                               lambda: _compare_table([EXAMPLE_MODEL, "-C", "8"], False)),
    "timing-prefetch-example-model": (
        "docs/timing.md", f"expertcache prefetch compare {EXAMPLE_MODEL} -C 8 --profile pcie-gen4-x16",
        lambda: _timed_compare_table([EXAMPLE_MODEL, "-C", "8", "--profile", "pcie-gen4-x16"])),
    "affinity-example-model": ("docs/experiments.md", f"expertcache affinity {EXAMPLE_MODEL} --best-of 0",
                               lambda: _affinity_table([EXAMPLE_MODEL, "--best-of", "0"])),
    "audit-example-model": (
        "docs/probes.md", f"expertcache audit {EXAMPLE_MODEL} --prompts {EXAMPLE_PROMPTS} --control 16",
        lambda: _audit_table([EXAMPLE_MODEL, "--prompts", EXAMPLE_PROMPTS, "--control", "16"])),
    "routers-temporal": ("docs/routers.md", "python scripts/routers_tables.py", _routers_temporal_table),
    "routers-budget": ("docs/routers.md", "python scripts/routers_tables.py", _routers_budget_table),
}

_BLOCK = r"(<!-- table: {name} -->\n)(.*?)(\n<!-- /table -->)"


def render(names: list[str] | None = None) -> dict[str, str]:
    """Each document's text with the named tables (default: all) regenerated."""
    docs: dict[str, str] = {}
    for name, (doc, _, make) in TABLES.items():
        if names and name not in names:
            continue
        text = docs.get(doc, (ROOT / doc).read_text())
        pat = re.compile(_BLOCK.format(name=re.escape(name)), flags=re.S)
        if not pat.search(text):
            raise SystemExit(f"{doc}: no '<!-- table: {name} -->' ... '<!-- /table -->' block")
        table = make()
        docs[doc] = pat.sub(lambda m, t=table: m.group(1) + t + m.group(3), text)
    return docs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a document differs; write nothing")
    ap.add_argument("names", nargs="*", help=f"tables to regenerate (default: all of {', '.join(TABLES)})")
    a = ap.parse_args(argv)
    stale = []
    for doc, text in render(a.names).items():
        if (ROOT / doc).read_text() != text:
            stale.append(doc)
            if not a.check:
                (ROOT / doc).write_text(text)
    if a.check and stale:
        print("stale tables in: " + ", ".join(stale) + " (run python scripts/docs_tables.py)", file=sys.stderr)
        return 1
    print(("up to date" if not stale else "rewrote " + ", ".join(stale)) if not a.check else "up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
