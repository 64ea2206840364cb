"""Per-layer lrfu's member loop alone, in several forms, each against the shipped form in the same process.

    python benchmarks/lrfu_members.py [--steps 2600] [--pairs 7] [--processes 2]

The event-atomic per-layer ``lrfu`` kernel (``replay/_kernels_bits.py``) spends half of its time applying each
event's members: per member a CRF ``S = 1 + S * P[u - PL]`` (float64), its last unit ``PL`` (int32) and its
float32 value ``V = S * scale``, three scattered stores, then one vector compare of the last units for the unit's
bits (docs/performance.md, *lrfu per layer: the decision is half the kernel*). This times that loop alone, on
``bench_vs_libcachesim.drifting_qwen_stream(steps)`` (48 x 128, B = 8), with no decision, in these forms:

* ``shipped`` — the kernel's form through session 30: members in expert order, each member's lane its layer's
  offset plus its tie position, the decay ``P[u - PL]``, three scalar stores, the compare; the peer of every
  row (the forms below are written from it);
* ``lane-table`` — the kernel's form since session 31: each member's lane from one table
  (``_kernels_bits.lrfu_lanes``), the decay from a reversed table viewed at the unit (``Vu[PL + 1]``): 11
  instructions a member where ``shipped`` takes 14;
* ``no-compare`` — the same without the compare (what waiting for the stores costs it);
* ``lane-order`` — the members sorted by tie position beforehand (outside the timing), so the stores run up
  each array: the best a reordering could do;
* ``record`` — a lane's CRF, last unit and value in one 16-byte record, without the compare (its last units
  are not dense lanes): compare it with ``no-compare``;
* ``line-pairs`` — the values and last units of 8 lanes in one 64-byte line (values in its first half), so
  that a member's last two stores go to one line, without the compare: compare it with ``no-compare``;
* ``gather-scatter`` — 16 members at a time by AVX-512 gathers and scatters (tie positions by ``vpermi2b``;
  machines with AVX512-VBMI only);
* ``no-value-store`` — *timing only*: the value not stored (what one store of three costs).

Every form but the last must leave the same CRFs, last units and values as ``shipped`` (exit 1 otherwise).
Each row is the median over ``--processes`` fresh processes of each one's median per-pair time ratio (form /
shipped, the two alternated pair by pair), with the process range, and the shipped form's time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import alternated_ratio, machine, median_and_range, pooled_rows  # noqa: E402

FORMS = ("lane-table", "no-compare", "lane-order", "record", "line-pairs", "gather-scatter", "no-value-store")
_TIMING_ONLY = ("no-value-store",)


def _kernels():
    """The forms as numba functions (compiled here so that ``--help`` and a bad option need no compiler)."""
    import numba
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from expertcache.replay._simd import _has_feature, _lanes, _splat, lanes_eq

    U = np.uint64
    i32 = ir.IntType(32)
    i64 = ir.IntType(64)
    f64 = ir.DoubleType()
    jit = numba.njit(error_model="numpy", nogil=True)
    inline = numba.njit(error_model="numpy", nogil=True, inline="always")

    @inline
    def unit(lay, lunits, scale, i):
        """Event ``i``'s layer, its lanes' offset, its layer unit (the layer's clock advanced) and that unit's
        scale: the same in every form."""
        layer = lay[i]
        u = lunits[layer]
        lunits[layer] = u + 1
        return layer, layer * 128, u, scale[U(u)]

    @inline
    def unit_bits(PL, pbase, u, ev):
        """The unit's bits: the lanes whose last unit is ``u``, one vector compare a word (as the kernel)."""
        for w in range(2):
            ev[w] = lanes_eq(PL, pbase + (w << 6), u)

    @jit
    def shipped(off, ex, lay, tp, n, S, PL, V, P, scale, lunits, ev, compare, store_value):
        for i in range(off.shape[0] - 1):
            layer, pbase, u, qu = unit(lay, lunits, scale, i)
            base = layer * n
            for a in range(off[i], off[i + 1]):
                j = U(pbase + tp[U(base + ex[U(a)])])
                s = 1.0 + S[j] * P[U(u - PL[j])]
                S[j] = s
                PL[j] = u
                if store_value:
                    V[j] = np.float32(s * qu)
            if compare:
                unit_bits(PL, pbase, u, ev)

    @jit
    def lane_table(off, ex, lay, lane, n, S, PL, V, Pr, scale, lunits, ev):
        for i in range(off.shape[0] - 1):
            layer, pbase, u, qu = unit(lay, lunits, scale, i)
            base = layer * n
            Vu = Pr[Pr.shape[0] - 2 - u:]                  # Vu[PL + 1] = P[u - PL]
            for a in range(off[i], off[i + 1]):
                j = U(lane[U(base + ex[U(a)])])
                s = 1.0 + S[j] * Vu[U(PL[j] + 1)]
                S[j] = s
                PL[j] = u
                V[j] = np.float32(s * qu)
            unit_bits(PL, pbase, u, ev)

    @jit
    def lane_order(off, lanes, lay, S, PL, V, P, scale, lunits, ev):
        for i in range(off.shape[0] - 1):
            layer, pbase, u, qu = unit(lay, lunits, scale, i)
            for a in range(off[i], off[i + 1]):
                j = U(pbase + lanes[U(a)])
                s = 1.0 + S[j] * P[U(u - PL[j])]
                S[j] = s
                PL[j] = u
                V[j] = np.float32(s * qu)
            unit_bits(PL, pbase, u, ev)

    @jit
    def record(off, ex, lay, tp, n, R, P, scale, lunits):
        Ri = R.view(np.int32)
        Rf = R.view(np.float32)
        for i in range(off.shape[0] - 1):
            layer, pbase, u, qu = unit(lay, lunits, scale, i)
            base = layer * n
            for a in range(off[i], off[i + 1]):
                j = U(pbase + tp[U(base + ex[U(a)])])
                s = 1.0 + R[U(2 * j)] * P[U(u - Ri[U(4 * j + 2)])]
                R[U(2 * j)] = s
                Ri[U(4 * j + 2)] = u
                Rf[U(4 * j + 3)] = np.float32(s * qu)

    @jit
    def line_pairs(off, ex, lay, tp, n, S, W, P, scale, lunits):
        Wf = W.view(np.float32)
        for i in range(off.shape[0] - 1):
            layer, pbase, u, qu = unit(lay, lunits, scale, i)
            base = layer * n
            for a in range(off[i], off[i + 1]):
                j = U(pbase + tp[U(base + ex[U(a)])])
                k = ((j >> U(3)) << U(4)) + (j & U(7))    # lane j: value at k, last unit at k + 8
                s = 1.0 + S[j] * P[U(u - W[k + U(8)])]
                S[j] = s
                W[k + U(8)] = u
                Wf[k] = np.float32(s * qu)

    @intrinsic
    def members16(typingctx, expert, a, cnt, tb, toff, pbase, S, PL, V, P, u, qu):
        """Up to 16 members from ``expert[a]``: tie positions from the 128-byte table ``tb[toff:]``; the CRFs,
        last units and values gathered and scattered (the members of a unit are distinct, so no lanes clash)."""
        sig = types.void(expert, types.int64, types.int64, tb, types.int64, types.int64, S, PL, V, P, types.int64,
                         types.float64)

        def codegen(context, builder, signature, args):
            expert, a, cnt, tb, toff, pbase, S, PL, V, P, u, qu = args
            i8 = ir.IntType(8)
            i8p = i8.as_pointer()
            bt = ir.VectorType(i8, 64)
            v16 = ir.VectorType(i32, 16)
            v8 = ir.VectorType(i32, 8)
            m16 = ir.VectorType(ir.IntType(1), 16)
            m8 = ir.VectorType(ir.IntType(1), 8)
            d8 = ir.VectorType(f64, 8)
            f16 = ir.VectorType(ir.FloatType(), 16)
            et = ir.IntType(signature.args[0].dtype.bitwidth)
            xt = ir.VectorType(et, 16)
            live = builder.icmp_signed("<", ir.Constant(v16, list(range(16))),
                                       _splat(builder, builder.trunc(cnt, i32), v16, 16))

            def fn(name, ret, argt):
                return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, argt), name)

            mload = fn(f"llvm.masked.load.v16i{et.width}.p0v16i{et.width}", xt, [xt.as_pointer(), i32, m16, xt])
            e = builder.call(mload, [_lanes(context, builder, signature.args[0], expert, a, 16, et),
                                     ir.Constant(i32, et.width // 8), live, ir.Constant(xt, None)])
            e8 = builder.trunc(e, ir.VectorType(i8, 16)) if et.width > 8 else e
            idx = builder.shuffle_vector(e8, e8, ir.Constant(ir.VectorType(i32, 64), list(range(16)) + [0] * 48))
            t0 = builder.load(_lanes(context, builder, signature.args[3], tb, toff, 64, i8), align=1)
            t1 = builder.load(_lanes(context, builder, signature.args[3], tb, builder.add(toff, ir.Constant(i64, 64)),
                                     64, i8), align=1)
            pos = builder.call(fn("llvm.x86.avx512.vpermi2var.qi.512", bt, [bt, bt, bt]), [t0, idx, t1])
            j = builder.add(builder.zext(builder.shuffle_vector(pos, pos, ir.Constant(v16, list(range(16)))), v16),
                            _splat(builder, builder.trunc(pbase, i32), v16, 16))

            def half(x, h):
                return builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(i32, 8), list(range(8 * h, 8 * h + 8))))

            gpd = fn("llvm.x86.avx512.mask.gather.dpd.512", d8, [d8, i8p, v8, m8, i32])
            gpi = fn("llvm.x86.avx512.mask.gather.dpi.512", v16, [v16, i8p, v16, m16, i32])
            spd = fn("llvm.x86.avx512.mask.scatter.dpd.512", ir.VoidType(), [i8p, m8, v8, d8, i32])
            spi = fn("llvm.x86.avx512.mask.scatter.dpi.512", ir.VoidType(), [i8p, m16, v16, v16, i32])
            sps = fn("llvm.x86.avx512.mask.scatter.dps.512", ir.VoidType(), [i8p, m16, v16, f16, i32])

            def ptr(k):
                return builder.bitcast(context.make_array(signature.args[k])(context, builder, args[k]).data, i8p)

            Sp, PLp, Vp, Pp = ptr(6), ptr(7), ptr(8), ptr(9)
            c8, c4 = ir.Constant(i32, 8), ir.Constant(i32, 4)
            uv = _splat(builder, builder.trunc(u, i32), v16, 16)
            gap = builder.sub(uv, builder.call(gpi, [ir.Constant(v16, None), PLp, j, live, c4]))
            q = _splat(builder, qu, d8, 8)
            vals = []
            for h in (0, 1):
                jh, mh = half(j, h), half(live, h)
                s_old = builder.call(gpd, [ir.Constant(d8, None), Sp, jh, mh, c8])
                p = builder.call(gpd, [ir.Constant(d8, None), Pp, half(gap, h), mh, c8])
                x = builder.fadd(ir.Constant(d8, [1.0] * 8), builder.fmul(s_old, p))
                builder.call(spd, [Sp, mh, jh, x, c8])
                vals.append(builder.fptrunc(builder.fmul(x, q), ir.VectorType(ir.FloatType(), 8)))
            builder.call(spi, [PLp, live, j, uv, c4])
            builder.call(sps, [Vp, live, j, builder.shuffle_vector(vals[0], vals[1],
                                                                  ir.Constant(v16, list(range(16)))), c4])
            return context.get_dummy_value()

        return sig, codegen

    @jit
    def gather_scatter(off, ex, lay, tb, S, PL, V, P, scale, lunits, ev):
        for i in range(off.shape[0] - 1):
            layer, pbase, u, qu = unit(lay, lunits, scale, i)
            hi = off[i + 1]
            for a in range(off[i], hi, 16):
                members16(ex, a, hi - a, tb, layer * 128, pbase, S, PL, V, P, u, qu)
            unit_bits(PL, pbase, u, ev)

    vbmi = _has_feature("avx512vbmi")
    return shipped, lane_table, lane_order, record, line_pairs, (gather_scatter if vbmi else None)


def _setup(steps: int):
    from bench_vs_libcachesim import drifting_qwen_stream

    from expertcache.replay import engine
    from expertcache.replay._kernels_bits import lrfu_lanes

    s = drifting_qwen_stream(steps, sample_seed=1)
    L, N = s.n_layers, s.n_experts
    if N > 128:
        raise SystemExit(f"{N} experts: these forms hold a layer in two 64-bit words (at most 128)")
    _, tie_pos = engine._tie_order(engine._tie_ranks("random", 0, L * N), L, N)
    units = int(np.bincount(s.layer, minlength=L).max()) + 2
    tp = tie_pos.reshape(L, N)
    event = np.repeat(np.arange(s.offsets.shape[0] - 1), np.diff(s.offsets))
    pos = tp[s.layer[event], s.expert]
    lanes = pos[np.lexsort((pos, event))].astype(np.int16)      # each event's members in tie-position order
    tb = np.zeros((L, 128), np.uint8)
    tb[:, :N] = tp
    P = 2.0 ** (-0.5 * np.arange(units))
    return s, tie_pos.astype(np.int16), lrfu_lanes(tie_pos, L, N), lanes, tb.reshape(-1), P, \
        np.ascontiguousarray(P[::-1]), 2.0 ** (0.5 * np.arange(units) / units)


def child(steps: int, pairs: int, first: int) -> None:
    shipped, lane_table, lane_order, record, line_pairs, gather_scatter = _kernels()
    s, tp, lane, lanes, tb, P, Pr, scale = _setup(steps)
    L, N = s.n_layers, s.n_experts
    off, ex, lay = s.offsets, s.expert, s.layer

    def state():
        return (np.zeros(L * 128), np.full(L * 128, -1, np.int32), np.zeros(L * 128, np.float32),
                np.zeros(L, np.int64), np.zeros(2, np.uint64))

    def run(form):
        S, PL, V, lu, ev = state()
        if form == "record":
            R = np.zeros(L * 128 * 2)
            R.view(np.int32)[2::4] = -1
            t0 = time.perf_counter()
            record(off, ex, lay, tp, N, R, P, scale, lu)
            dt = time.perf_counter() - t0
            return dt, (R[0::2].copy(), R.view(np.int32)[2::4].copy(), R.view(np.float32)[3::4].copy())
        if form == "line-pairs":
            W = np.zeros(L * 256, np.int32)
            W.reshape(-1, 16)[:, 8:] = -1
            t0 = time.perf_counter()
            line_pairs(off, ex, lay, tp, N, S, W, P, scale, lu)
            dt = time.perf_counter() - t0
            w = W.reshape(-1, 16)
            return dt, (S, w[:, 8:].reshape(-1).copy(), w[:, :8].reshape(-1).copy().view(np.float32))
        t0 = time.perf_counter()
        if form in ("shipped", "no-compare", "no-value-store"):
            shipped(off, ex, lay, tp, N, S, PL, V, P, scale, lu, ev, form != "no-compare",
                    form != "no-value-store")
        elif form == "lane-table":
            lane_table(off, ex, lay, lane, N, S, PL, V, Pr, scale, lu, ev)
        elif form == "lane-order":
            lane_order(off, lanes, lay, S, PL, V, P, scale, lu, ev)
        else:
            gather_scatter(off, ex, lay, tb, S, PL, V, P, scale, lu, ev)
        return time.perf_counter() - t0, (S, PL, V)

    ref = run("shipped")[1]
    out = []
    for form in FORMS:
        if form == "gather-scatter" and gather_scatter is None:
            out.append(float("nan"))
            continue
        got = run(form)[1]
        if form not in _TIMING_ONLY and not all(np.array_equal(x, y) for x, y in zip(ref, got, strict=True)):
            print(f"{form}: the CRFs, last units or values differ from the shipped form's", file=sys.stderr)
            sys.exit(1)
        out.append(alternated_ratio(lambda side, form=form: run(form if side == 0 else "shipped")[0], pairs, first))
    ts = sorted(run("shipped")[0] for _ in range(5))
    out.append(ts[2] * 1e3)
    print(" ".join(f"{x:.4f}" for x in out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2600, help="steps of the drifting stream (default 2600: 5 M)")
    ap.add_argument("--pairs", type=int, default=7, help="alternated pairs per form in each process")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--child", type=int, default=-1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.steps < 1 or a.pairs < 1 or a.processes < 1:
        ap.error("--steps, --pairs and --processes must be at least 1")
    if a.child >= 0:
        child(a.steps, a.pairs, a.child)
        return
    cols = pooled_rows([sys.executable, __file__, "--steps", str(a.steps), "--pairs", str(a.pairs)], a.processes)
    print(f"machine: {machine()}")
    print(f"lrfu member loop alone, {a.steps} steps, {a.processes} processes x {a.pairs} pairs: form / shipped "
          "(median, process range)")
    for form, col in zip(FORMS, cols, strict=False):
        if any(np.isnan(col)):
            print(f"  {form:<15} skipped (no AVX512-VBMI)")
            continue
        med, lo, hi = median_and_range(col)
        note = "  timing only" if form in _TIMING_ONLY else ""
        print(f"  {form:<15} {med:.3f}  ({lo:.3f}-{hi:.3f}){note}")
    print(f"  shipped form: {median_and_range(cols[-1])[0]:.2f} ms")


if __name__ == "__main__":
    main()
