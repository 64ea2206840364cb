"""A replay kernel's time here over another checkout's, the two alternated in each process, counts equal.

    python benchmarks/kernel_ab.py --baseline OTHER/src --kernel lfru --rhos 0.1,0.2,0.3,0.4,0.75
    python benchmarks/kernel_ab.py --baseline OTHER/src --kernel slots --steps 2600 --rhos 0.2,0.4 --processes 2

``OTHER`` is another checkout of expertcache (``git worktree add OTHER COMMIT``). Its package is loaded beside this
one under another name (its replay modules import each other relatively), so both kernels run in one process on one
stream, alternated pair by pair. Kernels: the event-atomic per-layer bitset loops ``lru``, ``lfu``, ``lfru``,
``lrfu`` (lambda 0.5) of ``_kernels_bits``, ``slots``, the global event-atomic lfru loop of ``_kernels_lfru_slots``
(cache ``rho * L * N``), and the sequential per-layer loops ``lfu-seq`` (and ``lfu-seq-in-cache``, with in-cache
counters), ``lrfu-seq``, ``lfru-seq`` of ``_kernels_seq`` (one unit per access, members ascending; a baseline from
before session 34 has none), and ``lru-seq`` / ``lru-seq-global``, sequential ``lru`` per layer / under global scope
(cache ``rho * L * N``; ``_kernels_seq.replay_lru_seq``; in a checkout without that loop, the generic list loop
``_kernels.replay_lru`` that the engine ran there), and ``belady-seq``, sequential per-layer ``belady``
(``_kernels_seq.replay_belady_seq``; in a checkout without it, the heap loop ``_kernels.replay_belady``; the next
uses computed once, not timed) and ``belady-global`` / ``belady-global-seq``, event-atomic / sequential ``belady``
with one global pool (cache ``rho * L * N``; ``_kernels_belady_buckets.replay_belady_buckets`` /
``replay_belady_units``, else the heap loop), and ``lru-global``, event-atomic ``lru`` with one global pool
(``_kernels_lru_events.replay_lru_events``, else the list loop ``_kernels.replay_lru``), ``lrfu-global``,
event-atomic ``lrfu`` (lambda 0.5) with one global pool (``_kernels_lrfu_global.replay_lrfu_global``; in a checkout
from before session 41, the heap loop ``_kernels_ranked.replay_ranked``), ``lrfu-global-slots``, the same on the
slots loop whatever the cache (``_kernels_lrfu_slots.replay_lrfu_slots``; in a checkout from before session 46, the
pool loop), ``lrfu-global-seq``, sequential ``lrfu``
(lambda 0.5) with one global pool (``_kernels_lrfu_window.replay_lrfu_window``, else the pool loop
``_kernels_lrfu_global.replay_lrfu_global``), ``lfru-global-seq``, sequential ``lfru`` with one global pool
(``_kernels_lfru_cands.replay_lfru_cands``; in a checkout from before session 53, the frequency groups,
``_kernels_lfru_groups.replay_lfru_groups``), and ``lfu-global`` / ``lfu-global-seq``, event-atomic / sequential
``lfu`` with one global pool (``_kernels_lfu_buckets.replay_lfu_buckets``), ``lfu-global-seq-in-cache`` the latter
with in-cache counters, ``shuffle``, sequential-random's shuffle of every event
(``_kernels_order.shuffle_events``, seed 0; the orders must be equal where the others' hits must), ``lru-layers``,
event-atomic per-layer ``lru`` as the engine replays it (``_kernels_belady_lanes.replay_lru_layers``: the lanes of
unit keys or the recency buckets; in a checkout from before session 49, the buckets, ``replay_lru_bits``),
``lfu-layers``, the same for ``lfu`` with counts that persist (``replay_lfu_layers``: the lanes of counts or the
bit-sliced counts; before session 49, ``replay_lfu_bits``), and ``belady-lanes``, per-layer ``belady`` on the lanes of
next uses (``replay_belady_lanes``; the next uses computed once, not timed). Hits per layer must be equal on both
sides (exit 1 otherwise), unless ``--timing-only``: for a prototype that takes a part out of a kernel to time what
that part costs, so that its decisions, and its counts, change; the rows then say that the counts differ. Prints per
rho the median over ``--processes`` fresh processes (a kernel's time moves by up to ~15% with where its code lands in
a process: docs/performance.md, *Placement noise*) of each process's median per-pair ratio
(ours / baseline), and their range. Stream: ``bench_vs_libcachesim.drifting_qwen_stream(steps)`` (48 x 128, B = 8;
5,200 steps is the 10 M-access benchmark stream, 650 the 1.25 M one), or with ``--batch B``
``bench_scaling.routed_stream`` at batch ``B`` (48 x 128, as many union accesses as ``steps`` steps of the drifting
stream; ``--experts N`` other than 128: 48 x N, at batch 8 unless ``--batch`` says); with ``--shuffled`` a sequential
kernel replays the members in sequential-random's order (seed 0, shuffled once beforehand, not timed) instead of
ascending. The processes compile into a
numba cache of their own, removed at the end (a kernel cached under the baseline's second name would not load in a
plain run of that checkout).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import alternated_ratio, machine, median_and_range, pooled_rows  # noqa: E402

KERNELS = ("lru", "lfu", "lfru", "lrfu", "slots", "lfu-seq", "lfu-seq-in-cache", "lrfu-seq", "lfru-seq", "lru-seq",
           "lru-seq-global", "belady-seq", "belady-global", "belady-global-seq", "lru-global", "lrfu-global",
           "lrfu-global-slots", "lrfu-global-seq", "lfru-global-seq", "lfu-global", "lfu-global-seq",
           "lfu-global-seq-in-cache", "shuffle", "lru-layers", "lfu-layers", "belady-lanes")


def _baseline(src: str):
    """The package under ``src`` (a checkout's ``src``) as ``expertcache_baseline``; its replay modules."""
    root = Path(src).resolve() / "expertcache"
    if not (root / "replay" / "_kernels_bits.py").is_file():
        raise SystemExit(f"{src}: expected a checkout's src folder holding expertcache/replay/_kernels_bits.py")
    name = "expertcache_baseline"
    spec = importlib.util.spec_from_file_location(name, root / "__init__.py", submodule_search_locations=[str(root)])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[name] = pkg
    spec.loader.exec_module(pkg)
    seq = (importlib.import_module(f"{name}.replay._kernels_seq") if (root / "replay" / "_kernels_seq.py").is_file()
           else None)
    return (importlib.import_module(f"{name}.replay._kernels_bits"),
            importlib.import_module(f"{name}.replay._kernels_lfru_slots"), seq,
            importlib.import_module(f"{name}.replay._kernels"))


def _sibling(generic, name: str):
    """The replay module ``name`` of the package whose ``replay._kernels`` is ``generic``, or ``None`` where that
    checkout has none (an older baseline)."""
    try:
        return importlib.import_module(generic.__name__.rsplit(".", 1)[0] + "." + name)
    except ModuleNotFoundError:
        return None


#: The kernels ``--shuffled`` takes: the sequential loops, one unit per access, whose order within an event matters.
SEQUENTIAL = ("lfu-seq", "lfu-seq-in-cache", "lrfu-seq", "lfru-seq", "lru-seq", "lru-seq-global", "belady-seq",
              "belady-global-seq", "lrfu-global-seq", "lfru-global-seq", "lfu-global-seq", "lfu-global-seq-in-cache")


class _Reordered:
    """A stream's arrays with its members in another order within each event (``--shuffled``)."""

    def __init__(self, s, expert: np.ndarray):
        for name in ("offsets", "layer", "step", "n_layers", "n_experts"):
            setattr(self, name, getattr(s, name))
        self.expert = expert


def child(src: str, kernel: str, steps: int, rhos: list[float], pairs: int, first: int,
          timing_only: bool = False, batch: int = 0, experts: int = 128, shuffled: bool = False) -> None:
    from bench_scaling import ACCESSES_PER_STEP, routed_stream
    from bench_vs_libcachesim import drifting_qwen_stream

    from expertcache.replay import _kernels as KK
    from expertcache.replay import _kernels_bits as KB
    from expertcache.replay import _kernels_lfru_slots as KS
    from expertcache.replay import _kernels_seq as KQ
    from expertcache.replay import engine

    sides = ((KB, KS, KQ, KK), _baseline(src))
    s = (routed_stream(48, experts, batch, steps * ACCESSES_PER_STEP) if batch
         else drifting_qwen_stream(steps, sample_seed=1))
    if shuffled:                   # sequential-random's order of seed 0, shuffled once, not timed
        s = _Reordered(s, engine._member_order(s, "sequential-random", 0))
    L, N = s.n_layers, s.n_experts
    tie = engine._tie_ranks("random", 0, L * N)
    order, tie_pos = engine._tie_order(tie, L, N)
    global_order = engine._tie_order(tie, 1, L * N)
    words = engine._order_words(0)
    flags = np.zeros(0, np.uint8)
    nxt = (KK.next_use(s.offsets, s.expert, s.layer, N, L, kernel == "belady-global")
           if kernel.startswith("belady") else None)
    out = []
    equal = []
    for rho in rhos:
        caps = engine.capacities_for_rho(rho, L, N)

        def run(side, caps=caps, rho=rho):
            bits, slots, seq, generic = sides[side]
            h = np.zeros(L, np.int64)
            m = np.zeros(L, np.int64)
            head = (s.offsets, s.expert, s.layer, N, L, caps, tie_pos)
            pool = np.array([int(round(rho * L * N))])        # one global pool's capacity
            t0 = time.perf_counter()
            if kernel == "lru":
                bits.replay_lru_bits(*head, 0, h, m, flags)
            elif kernel == "lfu":
                bits.replay_lfu_bits(*head, False, 0, h, m, flags)
            elif kernel == "lfru":
                bits.replay_lfru_bits(*head, 0, h, m, flags)
            elif kernel == "lrfu":
                bits.replay_lrfu_bits(*head, 0.5, 0, h, m, flags)
            elif kernel.startswith("lfu-seq"):
                seq.replay_lfu_seq(*head, kernel == "lfu-seq-in-cache", 0, h, m, flags)
            elif kernel == "lrfu-seq":
                seq.replay_lrfu_seq(*head, 0.5, 0, h, m, flags)
            elif kernel == "lfru-seq":
                seq.replay_lfru_seq(*head, 0, h, m, flags)
            elif kernel.startswith("lru-seq"):
                glob = kernel == "lru-seq-global"
                c = pool if glob else caps
                if hasattr(seq, "replay_lru_seq") and (
                        not glob or "global_scope" in inspect.signature(seq.replay_lru_seq).parameters):
                    seq.replay_lru_seq(s.offsets, s.expert, s.layer, N, L, c, 0, h, m, flags, *([True] if glob else []))
                else:              # a checkout without that loop: the generic list loop the engine ran there
                    generic.replay_lru(s.offsets, s.expert, s.layer, N, L, glob, False, c, order, tie_pos, 0, h, m,
                                       flags)
            elif kernel.startswith("belady-global"):
                atomic = kernel == "belady-global"
                bb = _sibling(generic, "_kernels_belady_buckets")
                loop = getattr(bb, "replay_belady_buckets" if atomic else "replay_belady_units", None)
                if loop is None:           # a checkout without it: the heap loop the engine ran there
                    generic.replay_belady(s.offsets, s.expert, s.layer, N, L, True, atomic, nxt, pool, tie, False, 0,
                                          h, m, flags)
                else:                      # (ours takes the tie orders; session 41's first form took the ranks)
                    orders = ((*((order, tie_pos) if atomic else ()), *global_order)
                              if "g_order" in inspect.signature(loop).parameters else (tie,))
                    loop(s.offsets, s.expert, s.layer, N, L, nxt, pool, *orders, False, 0, h, m, flags)
            elif kernel == "lru-global":
                ev = _sibling(generic, "_kernels_lru_events")
                if ev is None:             # a checkout without it: the list loop the engine ran there
                    generic.replay_lru(s.offsets, s.expert, s.layer, N, L, True, True, pool, order, tie_pos, 0, h, m,
                                       flags)
                else:
                    ev.replay_lru_events(s.offsets, s.expert, s.layer, N, L, pool, order, tie_pos, 0, h, m, flags)
            elif kernel == "lrfu-global":
                pl = _sibling(generic, "_kernels_lrfu_global")
                if pl is None:             # a checkout without it: the heap loop the engine ran there
                    _sibling(generic, "_kernels_ranked").replay_ranked(
                        s.offsets, s.expert, s.layer, s.step, N, L, True, True, pool, tie,
                        _sibling(generic, "keys").KEY_LRFU, int(L * N).bit_length(), 0, False, 0.5, 0, h, m, flags)
                else:
                    pl.replay_lrfu_global(s.offsets, s.expert, s.layer, N, L, True, pool, global_order[1], 0.5, 0, h,
                                          m, flags)
            elif kernel == "lrfu-global-slots":
                sl = _sibling(generic, "_kernels_lrfu_slots")
                if sl is None:             # a checkout without it: the pool loop
                    _sibling(generic, "_kernels_lrfu_global").replay_lrfu_global(
                        s.offsets, s.expert, s.layer, N, L, True, pool, global_order[1], 0.5, 0, h, m, flags)
                else:
                    sl.replay_lrfu_slots(s.offsets, s.expert, s.layer, N, L, pool, global_order[1], 0.5, 0, h, m,
                                         flags)
            elif kernel == "lrfu-global-seq":
                win = _sibling(generic, "_kernels_lrfu_window")
                if win is None:            # a checkout without it: the pool loop the engine ran there
                    _sibling(generic, "_kernels_lrfu_global").replay_lrfu_global(
                        s.offsets, s.expert, s.layer, N, L, False, pool, global_order[1], 0.5, 0, h, m, flags)
                else:
                    win.replay_lrfu_window(s.offsets, s.expert, s.layer, N, L, pool, global_order[1], 0.5, 0, h, m,
                                           flags)
            elif kernel == "lfru-global-seq":
                ca = _sibling(generic, "_kernels_lfru_cands")
                if ca is None:             # a checkout without it: the frequency groups the engine ran there
                    _sibling(generic, "_kernels_lfru_groups").replay_lfru_groups(
                        s.offsets, s.expert, s.layer, N, L, False, pool, tie, 0, h, m, flags)
                else:
                    ca.replay_lfru_cands(s.offsets, s.expert, s.layer, N, L, pool, tie, 0, h, m, flags)
            elif kernel.startswith("lfu-global"):
                _sibling(generic, "_kernels_lfu_buckets").replay_lfu_buckets(
                    s.offsets, s.expert, s.layer, N, L, kernel == "lfu-global", pool, global_order[1],
                    kernel.endswith("in-cache"), 0, h, m, flags)
            elif kernel == "shuffle":       # (the order compared where the other kernels compare hits)
                h = s.expert.copy()
                t0 = time.perf_counter()
                _sibling(generic, "_kernels_order").shuffle_events(s.offsets, h, words)
            elif kernel == "lru-layers":    # the engine's per-layer lru (before session 49: the buckets)
                lanes = _sibling(generic, "_kernels_belady_lanes")
                if hasattr(lanes, "replay_lru_layers"):
                    lanes.replay_lru_layers(*head, 0, h, m, flags)
                else:
                    bits.replay_lru_bits(*head, 0, h, m, flags)
            elif kernel == "lfu-layers":    # the same for lfu (counts that persist; before: the bit-sliced loop)
                lanes = _sibling(generic, "_kernels_belady_lanes")
                if hasattr(lanes, "replay_lfu_layers"):
                    lanes.replay_lfu_layers(*head, False, 0, h, m, flags)
                else:
                    bits.replay_lfu_bits(*head, False, 0, h, m, flags)
            elif kernel == "belady-lanes":
                _sibling(generic, "_kernels_belady_lanes").replay_belady_lanes(*head, nxt, False, 0, h, m, flags)
            elif kernel == "belady-seq":
                if hasattr(seq, "replay_belady_seq"):
                    seq.replay_belady_seq(*head, nxt, False, 0, h, m, flags)
                else:              # a checkout without that loop: the heap loop the engine ran there
                    generic.replay_belady(s.offsets, s.expert, s.layer, N, L, False, False, nxt, caps, tie, False, 0, h,
                                          m, flags)
            else:
                slots.replay_lfru_slots(s.offsets, s.expert, s.layer, N, L, pool, tie, 0, h, m, flags)
            return time.perf_counter() - t0, h

        same = bool((run(0)[1] == run(1)[1]).all())
        if not same and not timing_only:
            print(f"{kernel} at rho {rho}: hits differ from the baseline's (--timing-only times a prototype "
                  "whose counts differ)", file=sys.stderr)
            sys.exit(1)
        out.append(alternated_ratio(lambda side, run=run: run(side)[0], pairs, first))
        equal.append(same)
    print(" ".join([f"{x:.4f}" for x in out] + [f"{int(x)}" for x in equal]))   # ratios, then 1 where equal


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, help="another checkout's src folder")
    ap.add_argument("--kernel", choices=KERNELS, required=True)
    ap.add_argument("--steps", type=int, default=5200, help="steps of the drifting stream (default 5200: 10 M)")
    ap.add_argument("--rhos", default="0.1,0.2,0.3,0.4,0.75")
    ap.add_argument("--pairs", type=int, default=11, help="alternated pairs per rho in each process")
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--batch", type=int, default=0,
                    help="replay bench_scaling.routed_stream at this batch (48 x --experts, as many accesses as "
                         "--steps steps of the drifting stream) instead of the drifting stream")
    ap.add_argument("--experts", type=int, default=128,
                    help="experts a layer of the routed stream (48 x N); other than 128, the routed stream at batch 8 "
                         "unless --batch says")
    ap.add_argument("--shuffled", action="store_true",
                    help="a sequential kernel on the members in sequential-random's order (seed 0, shuffled once "
                         "beforehand), not ascending")
    ap.add_argument("--timing-only", action="store_true",
                    help="time a prototype whose counts differ from the baseline's (a part taken out of the "
                         "kernel); rows say where they differ")
    ap.add_argument("--child", type=int, default=-1, help=argparse.SUPPRESS)
    # The tests' own: a numba cache kept in DIR across runs of the script on the same checkouts, not removed.
    ap.add_argument("--cache-dir", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    rhos = [float(x) for x in a.rhos.split(",")]
    if a.child >= 0:
        child(a.baseline, a.kernel, a.steps, rhos, a.pairs, a.child, a.timing_only, a.batch, a.experts, a.shuffled)
        return
    if a.shuffled and a.kernel not in SEQUENTIAL:
        ap.error(f"--shuffled: expected a sequential kernel ({', '.join(SEQUENTIAL)}); got {a.kernel}")
    if a.batch < 0:
        raise SystemExit(f"--batch {a.batch}: a batch is at least 1 (0: the drifting stream)")
    if not 1 <= a.experts <= 1024:
        raise SystemExit(f"--experts {a.experts}: a layer of the routed stream has 1 to 1024 experts")
    if a.experts != 128 and not a.batch:
        a.batch = 8
    if _baseline(a.baseline)[2] is None and a.kernel in ("lfu-seq", "lrfu-seq", "lfru-seq"):   # fails here, once
        raise SystemExit(f"{a.baseline}: this checkout has no replay/_kernels_seq.py (sequential loops, session 34); "
                         f"--kernel {a.kernel} needs one on both sides")
    cache = a.cache_dir or tempfile.mkdtemp(prefix="kernel_ab_")
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    try:
        cols = pooled_rows([sys.executable, __file__, "--baseline", a.baseline, "--kernel", a.kernel, "--steps",
                            str(a.steps), "--rhos", a.rhos, "--pairs", str(a.pairs), "--batch", str(a.batch),
                            "--experts", str(a.experts)]
                           + (["--timing-only"] if a.timing_only else []) + (["--shuffled"] if a.shuffled else []),
                           a.processes, env)
    finally:
        if not a.cache_dir:
            shutil.rmtree(cache, ignore_errors=True)
    print(f"machine: {machine()}")
    shape = f" 48 x {a.experts}" if a.experts != 128 else ""
    stream = (f"routed stream{shape} at batch {a.batch}, " if a.batch else "") + ("members shuffled, " if a.shuffled
                                                                                   else "")
    print(f"{a.kernel}, {stream}{a.steps} steps, {a.processes} processes x {a.pairs} pairs: ours / baseline (median, "
          "process range)")
    for rho, col, eq in zip(rhos, cols[:len(rhos)], cols[len(rhos):], strict=True):
        med, lo, hi = median_and_range(col)
        note = "" if all(eq) else "  counts differ (--timing-only)"
        print(f"  rho {rho:<5} {med:.3f}  ({lo:.3f}-{hi:.3f}){note}")


if __name__ == "__main__":
    main()
