"""The report's figures (PNG and SVG): miss-ratio curves, regime, gap, permutation, traffic."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..replay import policy_names
from .block import _fmt
from .config import Report

__all__ = ["FIG_SEMANTICS"]

FIG_SEMANTICS = ("sequential-ascending", "event-atomic")


def _figures(report: Report, out: Path) -> list[str]:
    from ..plot import _pyplot

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
