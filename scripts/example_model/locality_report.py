"""Print the skew / temporal-locality table of a trace (docs/example_model.md quotes its output).

    python scripts/example_model/locality_report.py [TRACE_DIR]

Rows: all requests, then each prompt category (from the trace's provenance),
then the Jaccard of decode tokens ``lag`` steps apart (lag 1 = adjacent).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "src" / "expertcache" / "data" / "example_model_trace"
N_SHUFFLES, SEED = 20, 0


def lag_jaccard(trace, lag: int) -> float:
    """Mean Jaccard of the expert sets of decode tokens ``lag`` steps apart in the same request."""
    from expertcache.trace import DECODE

    rows = np.flatnonzero(trace.phase == DECODE)
    ex, req = trace.experts[rows].astype(np.int64), trace.request[rows]
    a = np.arange(rows.size - lag)
    a = a[req[a] == req[a + lag]]
    inter = (ex[a][:, :, :, None] == ex[a + lag][:, :, None, :]).sum(axis=(2, 3))
    return float((inter / (2 * trace.top_k - inter)).mean())


def table(trace_dir: Path) -> str:
    from expertcache.analysis.locality import routing_locality
    from expertcache.trace import read_trace, select_requests

    tr = read_trace(trace_dir)
    cats = tr.provenance.get("categories", {})
    groups = [("all", list(range(tr.n_requests)))]
    for cat in sorted(set(cats.values())):
        groups.append((cat, [i for i, r in enumerate(tr.request_ids) if cats.get(r) == cat]))
    lines = ["| requests | decode tokens | top-10% share | adjacent Jaccard | shuffled Jaccard |",
             "|---|---:|---:|---:|---:|"]
    uniform = None
    for name, idx in groups:
        sub = tr if name == "all" else select_requests(tr, idx)
        s = routing_locality(sub, n_shuffles=N_SHUFFLES, seed=SEED)
        uniform = s.uniform_jaccard
        lines.append(f"| {name} ({len(idx)}) | {s.n_decode_tokens} | {s.top_share:.3f} | "
                     f"{s.adjacent_jaccard:.3f} | {s.shuffled_jaccard:.3f} |")
    lines.append(f"| uniform routing | | 0.100 | {uniform:.3f} | {uniform:.3f} |")
    lines.append("")
    lines.append("| lag (decode steps) | " + " | ".join(str(g) for g in (1, 2, 3, 4, 8)) + " |")
    lines.append("|---|" + "---:|" * 5)
    lines.append("| Jaccard, all requests | " + " | ".join(f"{lag_jaccard(tr, g):.3f}" for g in (1, 2, 3, 4, 8))
                 + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT))
