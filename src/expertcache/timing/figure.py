"""The timeline of a window of steps: dense work, expert compute and the link, per MoE layer event."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import ExpertCacheError
from ..plot import _pyplot, save_figure
from .model import TimingResult

__all__ = ["plot_timeline"]


def plot_timeline(results: Sequence[TimingResult], path: str | os.PathLike[str], first_step: int = 0,
                  n_steps: int = 4) -> Path:
    """Draw ``n_steps`` counted steps from ``first_step`` on for each result (one panel per policy).

    Rows: the layer's dense work (routing known at its end), its experts computing (the wait for weights is
    part of this bar; its total is in the title), and the link carrying the layer's transfers (per channel
    share; with prefetches, its demand misses and the prefetches made for it, drawn from its routing although
    the prefetches were issued earlier). Times are milliseconds from the window's start.
    """
    path = Path(path)
    if path.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise ExpertCacheError(f"{path}: plot file must end in .png, .pdf or .svg")
    if not results:
        raise ExpertCacheError("nothing to plot")
    plt = _pyplot()
    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.2 * len(results) + 0.6), layout="constrained",
                             squeeze=False)
    colors = {"dense": "#9aa5b1", "experts": "#2b6cb0", "link": "#dd6b20"}
    for ax, r in zip(axes[:, 0], results, strict=True):
        t = r.timeline
        counted = np.flatnonzero(t.step_counted)
        if counted.size == 0:
            raise ExpertCacheError("nothing to plot: no counted steps")
        lo = counted[min(first_step, counted.size - 1)]
        hi = counted[min(first_step + n_steps, counted.size) - 1]
        t0, t1 = t.step_start[lo], t.step_end[hi]
        ev = np.flatnonzero((t.event_start >= t0) & (t.event_end <= t1))
        ms = 1e3
        for row, (name, a, b) in enumerate((("dense", t.event_start, t.event_routed),
                                            ("experts", t.event_routed, t.event_end),
                                            ("link", t.event_routed,
                                             t.event_routed + t.event_link / r.copy_streams)), start=0):
            spans = [((a[i] - t0) * ms, (b[i] - a[i]) * ms) for i in ev if b[i] > a[i]]
            ax.broken_barh(spans, (2 - row - 0.4, 0.8), facecolors=colors[name], edgecolors="white",
                           linewidth=0.3)
        for s in range(lo, hi + 1):
            ax.axvline((t.step_start[s] - t0) * ms, color="black", linewidth=0.6, alpha=0.5)
        stall = float(t.event_stall[ev].sum())
        ax.set_yticks([2, 1, 0], ["dense", "experts", "link"])
        ax.set_xlim(0, (t1 - t0) * ms)
        pre = "" if r.issue is None else (f", R = {r.prefetch_budget} issued {r.issue}: {r.prefetch_loads} "
                                         f"prefetches in the run ({r.prefetch_timely} timely, {r.prefetch_late} "
                                         f"late, {r.prefetch_useless} useless)")
        ax.set_title(f"{r.policy} ({r.contract}, {r.profile}){pre}\nsteps {first_step}-{first_step + hi - lo} of "
                     f"the counted ones; waiting for weights {stall * ms:.3f} ms of {(t1 - t0) * ms:.3f} ms",
                     fontsize=9)
    axes[-1, 0].set_xlabel("time in the window (ms); vertical lines: step starts")
    return save_figure(fig, path)

