"""Figures from result records. matplotlib is imported here only (the ``plot`` extra)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .errors import ExpertCacheError
from .replay.result import ReplayResult
from .storage import atomic_file

__all__ = ["plot_miss_ratio_curves", "save_figure"]


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        plt.rcParams["svg.hashsalt"] = "expertcache"   # fixed SVG element ids: the same figure, the same bytes
    except ImportError:
        raise ExpertCacheError("plotting needs matplotlib: pip install 'expertcache[plot]'") from None
    return plt


def plot_miss_ratio_curves(results: Sequence[ReplayResult], path: str | os.PathLike[str]) -> Path:
    """Effective miss fraction against residency fraction, one line per (policy, semantics, scope).

    The figure is written to a temporary file and renamed into place; the
    format follows the suffix (``.png``, ``.pdf``, ``.svg``).
    """
    path = Path(path)
    if path.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise ExpertCacheError(f"{path}: plot file must end in .png, .pdf or .svg")
    plt = _pyplot()
    lines: dict[tuple[str, str, str], list[ReplayResult]] = {}
    for r in results:
        if r.rho is not None:
            lines.setdefault((r.policy, r.semantics, r.scope), []).append(r)
    if not lines:
        raise ExpertCacheError("nothing to plot: results with a rho are needed")
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    for (policy, semantics, scope), rs in lines.items():
        rs = sorted(rs, key=lambda r: r.rho)
        style = "-" if semantics == "event-atomic" else "--"
        ax.plot([r.rho for r in rs], [r.miss_fraction for r in rs], style, marker="o", markersize=3,
                label=f"{policy} ({semantics}, {scope})")
    first = results[0]
    ax.set_xlabel("residency fraction rho (share of the L*N expert blocks)")
    ax.set_ylabel("effective miss fraction M / logical")
    ax.set_title(f"Miss-ratio curves — {first.n_events} events, union/logical {first.union_over_logical:.3f}")
    ax.grid(alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def save_figure(fig, path: str | os.PathLike[str]) -> Path:
    """Write ``fig`` to ``path`` through a temporary sibling renamed into place, then close it."""
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_file(path) as tmp:
            ext = path.suffix.lstrip(".").lower()
            meta = {"svg": {"Date": None}, "pdf": {"CreationDate": None, "ModDate": None}}.get(ext, {})
            fig.savefig(tmp, dpi=150, format=ext, metadata=meta)   # no creation date: byte-reproducible
    finally:
        plt.close(fig)
    return path
