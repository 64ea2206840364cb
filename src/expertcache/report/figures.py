"""The report's figures (PNG and SVG): miss-ratio curves, regime, gap, permutation, traffic."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..replay import policy_names
from .block import _fmt
from .config import Report

__all__ = ["FIG_SEMANTICS", "reproducible_metadata"]

FIG_SEMANTICS = ("sequential-ascending", "event-atomic")


def _figures(report: Report, out: Path) -> list[str]:
    from ..plot import _pyplot

    plt = _pyplot()
    plt.rcParams["svg.hashsalt"] = "expertcache"     # fixed SVG ids (no random salt): byte-reproducible reports
    f = report.figures
    names = []

    def save(fig, name):
        for ext in ("png", "svg"):
            fig.savefig(out / f"{name}.{ext}", dpi=130, metadata=reproducible_metadata(ext))
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
        fig, ax = plt.subplots(figsize=(6, 4.6), layout="constrained")
        seed0 = f["gap"].seeds[0]
        ax.plot(xs, [(r["gap"] or 0) * 100 for r in rows], "o-", color="tab:blue",
                label=f"recoverable gap, % (left axis; tie seed {seed0})")
        ax.set_xlabel(xlab)
        ax.set_ylabel("recoverable gap (%)", color="tab:blue")
        ax.set_ylim(bottom=0)
        if key == "batch_sweep":
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.minorticks_off()
        else:
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax2 = ax.twinx()
        ax2.plot(xs, [r["r_mean"] for r in rows], "s--", color="tab:red", label="mean r(s,l) (right axis)")
        ax2.axhline(1.0, color="tab:red", lw=0.8, ls=":", label="r = 1: union = capacity (right axis)")
        ax2.set_ylabel("mean r(s,l) = union / capacity", color="tab:red")
        ax2.set_ylim(bottom=0, top=max(1.1, 1.1 * max(r["r_mean"] for r in rows)))
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        fig.legend(h1 + h2, l1 + l2, fontsize=8, loc="outside lower center", ncols=2)   # below: never over data
        ax.set_title(f"Gap and regime versus {xlab}")
        save(fig, name)
    # decomposition bars (Fig. 4 shape)
    g = f["gap"]
    fig, ax = plt.subplots(figsize=(5, 4), layout="constrained")
    ax.bar(["admission", "future victim"], [(g.admission_share or 0) * 100, (g.future_victim_share or 0) * 100],
           color=["tab:blue", "tab:orange"])
    ax.set_ylabel("share of the recoverable gap (%)")
    ax.set_title(f"Gap {_fmt(g.gap, True)} vs {g.best_causal} (mean of {len(g.seeds)} tie seeds): decomposition")
    save(fig, "gap_decomposition")
    # permutation ablation (Fig. 3 shape)
    if f["perm"] is not None:
        p = f["perm"]
        fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
        ks = list(range(1, len(p.permuted_gaps) + 1))
        vals = [(x or 0) * 100 for x in p.permuted_gaps]
        ax.axhline((p.original_gap or 0) * 100, color="black", label=f"original order ({p.original_best_causal})")
        ax.plot(ks, vals, "o", label="step permutations")
        ax.set_xticks(ks)
        ax.set_xlabel("permutation (seeded step shuffle)")
        ax.set_ylabel("recoverable gap (%)")
        ax.set_ylim(0, 1.15 * max([*vals, (p.original_gap or 0) * 100, 1e-9]))   # from zero: no exaggerated spread
        ax.set_title("Same events, same mean r: only temporal order changes (§6.5)")
        ax.legend(loc="lower right")
        save(fig, "permutation_ablation")
    # miss-ratio curves
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    for pol, pts in f["curves"].items():
        label = f"{pol} (best causal at rho = {report.data['config']['rho']:g})" if pol == f["gap"].best_causal \
            else pol
        ax.plot([r for r, _ in pts], [m * 100 for _, m in pts], "o-", ms=3, label=label)
    ax.set_xlabel("residency fraction rho")
    ax.set_ylabel("effective miss fraction (%)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Miss-ratio curves (event-atomic, tie seed {f['gap'].seeds[0]})")
    ax.legend()
    save(fig, "miss_ratio_curves")
    # event size against capacity: |E(s,l)| is an integer, so one bar per size (r = |E| / c_l is discrete)
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    sizes, counts = np.unique(np.asarray(f["event_size"]), return_counts=True)
    ax.bar(sizes, counts, width=0.8, color="tab:blue", label="events with this union size")
    caps = f["capacities"]
    lo, hi = min(caps), max(caps)
    if lo == hi:
        ax.axvline(lo + 0.5, color="black", lw=1, label=f"capacity c_l = {lo:g}: r > 1 to the right")
    else:
        ax.axvspan(lo + 0.5, hi + 0.5, color="black", alpha=0.15, lw=0,
                   label=f"capacities c_l = {lo:g}-{hi:g}: r > 1 to the right")
    ax.set_xlabel("union size |E(s,l)| (experts per layer-step)")
    ax.set_ylabel("events")
    ax.xaxis.get_major_locator().set_params(integer=True)
    over = float(np.mean(np.asarray(f["ratio"]) > 1))
    ax.set_title(f"Event size against capacity (§6.1): r = |E|/c_l > 1 for {over:.1%} of events", fontsize=10)
    ax.set_ylim(0, 1.3 * max(int(counts.max()), 1))          # headroom for the legend above the bars
    ax.legend(fontsize=8, loc="upper right")
    save(fig, "event_ratio_histogram")
    return names


def reproducible_metadata(ext: str) -> dict:
    """Figure metadata without a creation date, so that the same report renders to the same bytes."""
    return {"svg": {"Date": None}, "pdf": {"CreationDate": None, "ModDate": None}}.get(ext, {})
