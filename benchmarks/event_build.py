"""Event building's per-step kernels with no branch per entry against the general one, alternated, equal outputs.

    python benchmarks/event_build.py [--batches 1,8,32] [--requests 48] [--tokens 384] [--experts 128] [--pairs 7]
                                     [--json]

The trace: ``expertcache.trace.synth`` (48 layers x N experts, top-8, with gates, REQUESTS x TOKENS decode tokens,
seed 0), scheduled by FCFS continuous batching at each batch B. Sides, in one process on the same schedule:
``ours``, ``events._kernels.step_layer_events`` as it runs for N <= 1,024 (no branch per entry, the members read
from the event's bits: ``_step_layer_events_bits`` in two registers for N <= 128, ``_step_layer_events_words``
past it), and ``any``, ``_step_layer_events_any`` (what it runs past 1,024 experts, and ran for every N before
session 69: a test per entry of whether its expert is new). Each side writes into arrays of its own, allocated and
written once before the timing (first touch is not timed); every output array of the two must be byte-equal (exit 1
otherwise). Prints per batch each side's median ns per (token, layer, slot) entry over ``--pairs`` alternated pairs
and the min and median of the per-pair ratios any / ours.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import checked_pairs, int_list, machine, pair_fields, positive_int  # noqa: E402


def schedule(trace, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The FCFS schedule of ``trace``'s decode tokens at ``batch``: (step, trace row) of each executed token."""
    from expertcache.events.fcfs import decode_rows, fcfs_schedule

    lengths, first = decode_rows(trace)
    step, req, tok = fcfs_schedule(lengths, np.zeros(trace.n_requests, np.int64), batch)
    return np.ascontiguousarray(step, np.int64), np.ascontiguousarray(first[req] + tok, np.int64)


def row(trace, batch: int, pairs: int) -> dict:
    """One batch's row: both kernels' outputs compared, then timed over ``pairs`` alternated pairs."""
    from expertcache.events import _kernels as K

    step, rows = schedule(trace, batch)
    L, N, k = trace.n_layers, trace.n_experts, trace.top_k
    n_steps = int(np.count_nonzero(np.diff(step))) + 1
    entries = rows.shape[0] * L * k

    def arrays() -> list[np.ndarray]:
        out = [np.empty(n_steps * L, np.int64), np.empty(n_steps * L + 1, np.int64), np.empty(entries, np.int16),
               np.empty(entries, np.int32), np.empty(entries, np.float32), np.empty(n_steps * L, np.int32)]
        for a in out:
            a.fill(0)
        return out

    bufs = {True: arrays(), False: arrays()}

    def timed(ours: bool, check: bool) -> tuple:
        kernel = K.step_layer_events if ours else K._step_layer_events_any
        out = bufs[ours]
        t0 = time.perf_counter()
        n_ev, n_u = kernel(step, rows, trace.experts, trace.gates, True, N, *out)
        dt = time.perf_counter() - t0
        if not check:
            return (dt,)
        lengths = (n_ev, n_ev + 1, n_u, n_u, n_u, n_ev)
        return (dt, *(a[:n].view(np.uint8).copy() for a, n in zip(out, lengths, strict=True)))

    ours, other, equal = checked_pairs(timed, pairs)
    return {"batch": batch, "entries": entries, **pair_fields(("any", "ours"), other, ours, entries),
            "outputs_equal": equal}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int_list, default=[1, 8, 32], help="comma list of batch sizes (default 1,8,32)")
    ap.add_argument("--requests", type=positive_int, default=48, help="requests of the trace (default 48)")
    ap.add_argument("--tokens", type=positive_int, default=384, help="decode tokens a request (default 384)")
    ap.add_argument("--experts", type=positive_int, default=128, help="experts a layer, at most 1024 (default 128)")
    ap.add_argument("--pairs", type=positive_int, default=7, help="alternated pairs a row (default 7)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args(argv)
    from expertcache.events import _kernels as K

    if args.experts > K._WORDS_MAX_EXPERTS:
        ap.error(f"--experts: expected at most {K._WORDS_MAX_EXPERTS} (the layers of the kernels with no branch per "
                 f"entry); got {args.experts}")
    from expertcache.trace.synth import SynthConfig, synthesize_trace

    trace = synthesize_trace(SynthConfig(n_layers=48, n_experts=args.experts, top_k=min(8, args.experts),
                                         n_requests=args.requests, decode_tokens=args.tokens, seed=0))
    rows = [row(trace, b, args.pairs) for b in args.batches]
    meta = {"machine": machine(), "layers": 48, "experts": args.experts, "top_k": trace.top_k,
            "requests": args.requests, "tokens": args.tokens, "pairs": args.pairs}
    if args.json:
        print(json.dumps({**meta, "rows": rows}))
    else:
        print(f"machine: {machine()}")
        print(f"48 x {args.experts}, top-{trace.top_k}, {args.requests} requests x {args.tokens} tokens: ns per entry "
              f"(medians of {args.pairs} alternated pairs); any / ours: min and median of per-pair ratios")
        print(f"{'B':>4} {'entries':>11} {'ours':>7} {'any':>7} {'min':>6} {'median':>6}  outputs equal")
        for r in rows:
            print(f"{r['batch']:>4} {r['entries']:>11,} {r['ours_ns']:>7.2f} {r['any_ns']:>7.2f} "
                  f"{r['ratio_min']:>6.2f} {r['ratio']:>6.2f}  {'yes' if r['outputs_equal'] else 'NO'}")
    return 0 if all(r["outputs_equal"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
