"""Float32 vectors that a numba loop holds in registers from one access to the next.

A numba variable of type :class:`F32Vec` is one LLVM ``<n x float>`` value: LLVM keeps it in vector registers
(``n / 16`` of them on AVX-512) through the loop's branches and calls of inlined helpers, so a chain of
accesses that each rewrite one lane and then read every lane pays no store and reload between them (a scalar
store into a block that a vector load reads next is not forwarded: the load waits until the store leaves the
core). A lane is set by a compare with the lane number and a masked broadcast, not through memory.

* :class:`Lanes` — a marker passed into a loop; its type fixes ``n`` (16, 32 or 64), so that
  numba compiles the loop once per width.
* :func:`vload` — ``n`` float32 values of an array from an element offset.
* :func:`vset`, :func:`vadd` — a copy with one lane replaced, or added to.
* :func:`vlowest` — the smallest packed ``count / age`` key of ``n`` lanes of counts and last units, and whether
  another lies near it (the sequential per-layer ``lfru`` loop of :mod:`._kernels_seq`).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import NativeValue, intrinsic, models, register_model, typeof_impl, unbox

from ._simd import _splat

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_F32 = ir.FloatType()

#: The lane counts a :class:`Lanes` may hold.
WIDTHS = (16, 32, 64)


class F32Vec(types.Type):
    """``n`` float32 lanes as one LLVM vector value."""

    def __init__(self, n: int):
        self.n = n
        super().__init__(name=f"F32Vec({n})")


class LanesType(types.Type):
    """The numba type of a :class:`Lanes` marker: its width, nothing at run time."""

    def __init__(self, n: int):
        self.n = n
        super().__init__(name=f"Lanes({n})")


class Lanes:
    """A width for the vectors of a loop (``n`` in :data:`WIDTHS`), passed as an argument: numba types it as
    ``LanesType(n)``, so each width is its own compiled (and cached) loop."""

    def __init__(self, n: int):
        if n not in WIDTHS:
            raise ValueError(f"lanes must be one of {WIDTHS}, got {n}")
        self.n = n


@register_model(F32Vec)
class _F32VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(_F32, fe_type.n))


register_model(LanesType)(models.OpaqueModel)


@typeof_impl.register(Lanes)
def _typeof_lanes(val, c):
    return LanesType(val.n)


@unbox(LanesType)
def _unbox_lanes(typ, obj, c):
    return NativeValue(c.context.get_dummy_value())


def _pointer(context, builder, aty, ary, off, n):
    data = context.make_array(aty)(context, builder, ary).data
    return builder.bitcast(builder.gep(data, [off]), ir.VectorType(_F32, n).as_pointer())


@intrinsic
def vload(typingctx, arr, off, lanes):
    """``arr[off : off + n]`` (float32) as one vector, ``n`` the width of ``lanes``."""
    sig = F32Vec(lanes.n)(arr, types.int64, lanes)

    def codegen(context, builder, signature, args):
        return builder.load(_pointer(context, builder, signature.args[0], args[0], args[1], signature.args[2].n),
                            align=4)

    return sig, codegen


def _lane_mask(builder, n, lane):
    vni = ir.VectorType(_I32, n)
    return builder.icmp_signed("==", ir.Constant(vni, list(range(n))), _splat(builder, builder.trunc(lane, _I32),
                                                                               vni, n))


@intrinsic
def vset(typingctx, v, lane, x):
    """``v`` with lane ``lane`` (``0 <= lane < n``) set to ``x`` (a compare with the lane numbers and a select)."""
    sig = v(v, types.int64, types.float32)

    def codegen(context, builder, signature, args):
        n = signature.args[0].n
        return builder.select(_lane_mask(builder, n, args[1]), _splat(builder, args[2], ir.VectorType(_F32, n), n),
                              args[0])

    return sig, codegen


@intrinsic
def vadd(typingctx, v, lane, x):
    """``v`` with ``x`` added to lane ``lane``."""
    sig = v(v, types.int64, types.float32)

    def codegen(context, builder, signature, args):
        n = signature.args[0].n
        return builder.select(_lane_mask(builder, n, args[1]),
                              builder.fadd(args[0], _splat(builder, args[2], ir.VectorType(_F32, n), n)), args[0])

    return sig, codegen


def packed_lfru_keys(builder, F, L, t1, hmask, lanes, n):
    """IR: ``n`` lanes' packed lfru keys: ``F / (t1 - L)`` in float32, its low bits (``~hmask``) replaced by
    ``lanes`` (``<n x i32>``)."""
    k = builder.fdiv(F, builder.fsub(_splat(builder, t1, ir.VectorType(_F32, n), n), L))
    return builder.or_(builder.and_(builder.bitcast(k, ir.VectorType(_I32, n)),
                                    _splat(builder, hmask, ir.VectorType(_I32, n), n)), lanes)


def fold_two_lowest(builder, m1, m2, q):
    """IR: the two smallest per lane (``m1 <= m2``, ``<16 x i32>``) after group ``q`` joins them."""
    hi = builder.select(builder.icmp_signed(">", m1, q), m1, q)
    return builder.select(builder.icmp_signed("<", q, m1), q, m1), builder.select(builder.icmp_signed("<", hi, m2),
                                                                                   hi, m2)


def lowest_and_near(builder, m1, m2, hmask, d):
    """IR, from the two smallest per lane (``<16 x i32>``): the smallest of all, as i64, with bit 32 set where
    another is at most ``((smallest & hmask) + d) | ~hmask``."""
    v16 = ir.VectorType(_I32, 16)
    red = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, [v16]), "llvm.vector.reduce.smin.v16i32")
    g = builder.call(red, [m1])
    vthr = _splat(builder, builder.or_(builder.add(builder.and_(g, hmask), d), builder.not_(hmask)), v16, 16)
    near = builder.or_(builder.icmp_signed("<=", m2, vthr),
                       builder.and_(builder.icmp_signed("<=", m1, vthr),
                                    builder.icmp_signed("!=", m1, _splat(builder, g, v16, 16))))
    any_near = builder.icmp_unsigned("!=", builder.bitcast(near, ir.IntType(16)), ir.Constant(ir.IntType(16), 0))
    return builder.or_(builder.zext(g, _I64), builder.shl(builder.zext(any_near, _I64), ir.Constant(_I64, 32)))


@intrinsic
def vlowest(typingctx, F, L, t1, hmask, d):
    """The smallest packed key of ``n`` lanes, and in bit 32 whether another lies within ``d`` float32 units in
    the last place above it: lane ``s``'s key ``F[s] / (t1 - L[s])`` in float32, its bits with the low ones
    (``~hmask``) replaced by ``s``; another lies within when its packed key is at most ``((smallest & hmask) +
    d) | ~hmask``. :func:`._kernels_seq.lfru_lowest` on vectors in registers: the lanes folded into groups of 16
    keeping the two smallest per lane, then one reduction and one compare."""
    sig = types.int64(F, L, types.float32, types.int32, types.int32)

    def codegen(context, builder, signature, args):
        F, L, t1, hmask, d = args
        n = signature.args[0].n
        v16 = ir.VectorType(_I32, 16)
        p = packed_lfru_keys(builder, F, L, t1, hmask, ir.Constant(ir.VectorType(_I32, n), list(range(n))), n)
        m1 = builder.shuffle_vector(p, p, ir.Constant(v16, list(range(16))))
        m2 = ir.Constant(v16, [2**31 - 1] * 16)
        for g in range(1, n // 16):
            m1, m2 = fold_two_lowest(builder, m1, m2,
                                     builder.shuffle_vector(p, p, ir.Constant(v16, list(range(16 * g, 16 * g + 16)))))
        return lowest_and_near(builder, m1, m2, hmask, d)

    return sig, codegen
