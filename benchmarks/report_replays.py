"""Where ``expertcache report`` spends its replay time: the seconds of its replays by policy and semantics.

    python benchmarks/report_replays.py TRACE [--no-warmup] [--json]

Runs ``expertcache report TRACE -o OUT --no-figures`` in this process (``OUT`` a temporary directory), with the
engine's replay (``replay.engine._replay``) wrapped to time each call, and prints for every (policy, semantics,
scope) the number of replays and their seconds, largest first, then the report's own wall time and the share of
it the replays took. A first, untimed report warms numba's caches (``--no-warmup`` skips it). The code timed is
the ``expertcache`` this interpreter imports: run it with ``PYTHONPATH=OTHER/src`` for another checkout.

``TRACE``: the Qwen3-sized trace of ``benchmarks/bench_commands.py`` (its ``--dir DIR`` keeps it as
``DIR/trace``), or any recorded trace.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import machine  # noqa: E402


def timed_report(trace: str) -> tuple[float, dict[tuple[str, str, str], list[float]]]:
    """One report of ``trace`` into a temporary directory: its wall seconds, and per (policy, semantics, scope)
    the count and seconds of its replays."""
    import expertcache.replay.engine as engine
    from expertcache.cli.main import main as cli

    spent: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    real = engine._replay

    def wrapped(stream, config, *args, **kwargs):
        t = time.perf_counter()
        try:
            return real(stream, config, *args, **kwargs)
        finally:
            row = spent[(config.policy, config.semantics, config.scope)]
            row[0] += 1
            row[1] += time.perf_counter() - t

    engine._replay = wrapped
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            try:
                with contextlib.redirect_stdout(io.StringIO()):      # the report's own summary
                    cli(["report", trace, "-o", str(Path(tmp) / "report"), "--no-figures", "--json"],
                        standalone_mode=False)
            finally:
                wall = time.perf_counter() - t
    finally:
        engine._replay = real
    return wall, dict(spent)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="a trace directory")
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed first report")
    ap.add_argument("--json", action="store_true", help="print the rows as one JSON object")
    args = ap.parse_args(argv)
    if not (Path(args.trace) / "manifest.json").is_file():
        sys.exit(f"error: {args.trace} is not a trace directory (no manifest.json); build one with "
                 "benchmarks/bench_commands.py --dir DIR (DIR/trace)")
    if not args.no_warmup:
        timed_report(args.trace)
    wall, spent = timed_report(args.trace)
    rows = sorted(spent.items(), key=lambda kv: -kv[1][1])
    total = sum(s for _, s in spent.values())
    if args.json:
        print(json.dumps({"machine": machine(), "wall_s": wall, "replay_s": total,
                          "rows": [{"policy": p, "semantics": se, "scope": sc, "calls": n, "seconds": s}
                                   for (p, se, sc), (n, s) in rows]}))
        return
    print(f"machine: {machine()}")
    print(f"{'policy':<20}{'semantics':<22}{'scope':<11}{'calls':>6}{'seconds':>9}")
    for (p, se, sc), (n, s) in rows:
        print(f"{p:<20}{se:<22}{sc:<11}{n:>6}{s:>9.3f}")
    print(f"report: {wall:.2f} s, of which replays {total:.2f} s ({100 * total / wall:.0f}%)")


if __name__ == "__main__":
    main()
