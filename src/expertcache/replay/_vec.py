"""Float32 and int32 vectors that a numba loop holds in registers from one access to the next.

A numba variable of type :class:`F32Vec` is one LLVM ``<n x float>`` value: LLVM keeps it in vector registers
(``n / 16`` of them on AVX-512) through the loop's branches and calls of inlined helpers, so a chain of
accesses that each rewrite one lane and then read every lane pays no store and reload between them (a scalar
store into a block that a vector load reads next is not forwarded: the load waits until the store leaves the
core). A lane is set by a compare with the lane number and a masked broadcast, not through memory.

* :class:`Lanes` — a marker passed into a loop; its type fixes ``n`` (16, 32 or 64), so that
  numba compiles the loop once per width.
* :func:`vload`, :func:`vstore` — ``n`` float32 (or int32) values of an array from an element offset, and back.
* :func:`lane_bits` — ``log2 n``, a constant where the loop is compiled.
* :func:`vset` — a copy with one lane replaced.
* :class:`I32Vec`, :func:`ilowest`, :func:`icount_le`, :func:`ifind`, :func:`ikey_lowest`, :func:`iset_lowest` —
  ``n`` int32 lanes (:func:`vload` of an int32 array), their smallest, how many lie at most a bound (the sequential
  per-layer ``lrfu`` loop's packed keys), the lane that holds a value (its slots' tie positions), and a copy with
  the smallest's lane replaced.
* :func:`vlowest` — the smallest packed ``count / age`` key of ``n`` lanes of reciprocal counts and last units, and
  whether another lies near it (the sequential per-layer ``lfru`` loop of :mod:`._kernels_seq`); :func:`vset_lowest`
  a vector with the lane of that key replaced.
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


class I32Vec(types.Type):
    """``n`` int32 lanes as one LLVM vector value."""

    def __init__(self, n: int):
        self.n = n
        super().__init__(name=f"I32Vec({n})")


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


@register_model(I32Vec)
class _I32VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(_I32, fe_type.n))


register_model(LanesType)(models.OpaqueModel)


@typeof_impl.register(Lanes)
def _typeof_lanes(val, c):
    return LanesType(val.n)


@unbox(LanesType)
def _unbox_lanes(typ, obj, c):
    return NativeValue(c.context.get_dummy_value())


def _pointer(context, builder, aty, ary, off, n):
    data = context.make_array(aty)(context, builder, ary).data
    elt = _I32 if aty.dtype == types.int32 else _F32
    return builder.bitcast(builder.gep(data, [off]), ir.VectorType(elt, n).as_pointer())


@intrinsic
def vload(typingctx, arr, off, lanes):
    """``arr[off : off + n]`` (float32, or int32) as one vector (:class:`F32Vec`, :class:`I32Vec`), ``n`` the width
    of ``lanes``."""
    sig = (I32Vec if arr.dtype == types.int32 else F32Vec)(lanes.n)(arr, types.int64, lanes)

    def codegen(context, builder, signature, args):
        return builder.load(_pointer(context, builder, signature.args[0], args[0], args[1], signature.args[2].n),
                            align=4)

    return sig, codegen


@intrinsic
def vstore(typingctx, arr, off, v):
    """``v`` into ``arr[off : off + n]`` (of ``v``'s type)."""
    sig = types.none(arr, types.int64, v)

    def codegen(context, builder, signature, args):
        builder.store(args[2], _pointer(context, builder, signature.args[0], args[0], args[1], signature.args[2].n),
                      align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def lane_bits(typingctx, lanes):
    """The bits of a lane's index (``log2 n``) as a constant of the compiled loop."""
    sig = types.int64(lanes)

    def codegen(context, builder, signature, args):
        return ir.Constant(_I64, (signature.args[0].n - 1).bit_length())

    return sig, codegen


def _cmp_splat(builder, op, V, x, n):
    """IR: the ``<n x i1>`` of ``lane op x`` over the int32 lanes of ``V`` (``x`` int64, within int32's range)."""
    return builder.icmp_signed(op, V, _splat(builder, builder.trunc(x, _I32), ir.VectorType(_I32, n), n))


def _lane_mask(builder, n, lane):
    return _cmp_splat(builder, "==", ir.Constant(ir.VectorType(_I32, n), list(range(n))), lane, n)


@intrinsic
def vset(typingctx, v, lane, x):
    """``v`` with lane ``lane`` (``0 <= lane < n``) set to ``x`` (a compare with the lane numbers and a select; ``x``
    float32 for an :class:`F32Vec`, int32 for an :class:`I32Vec`)."""
    sig = v(v, types.int64, types.int32 if isinstance(v, I32Vec) else types.float32)

    def codegen(context, builder, signature, args):
        n = signature.args[0].n
        elt = _I32 if isinstance(signature.args[0], I32Vec) else _F32
        return builder.select(_lane_mask(builder, n, args[1]), _splat(builder, args[2], ir.VectorType(elt, n), n),
                              args[0])

    return sig, codegen


def packed_lfru_keys(builder, R, L, t1, hmask, lanes, n):
    """IR: ``n`` lanes' packed lfru keys from reciprocal counts ``R`` (``1 / count`` in float32, 0 in an empty
    lane) and last units ``L``: the float32 product ``R * (t1 - L)`` (the age over the count, no division), its
    bits flipped (``^ 0x7FFFFFFF``: the largest product, the smallest ``count / age``, has the smallest key, all
    keys non-negative), the low bits (``~hmask``) replaced by ``lanes`` (``<n x i32>``)."""
    vi = ir.VectorType(_I32, n)
    k = builder.fmul(R, builder.fsub(_splat(builder, t1, ir.VectorType(_F32, n), n), L))
    flipped = builder.xor(builder.bitcast(k, vi), _splat(builder, ir.Constant(_I32, 0x7FFFFFFF), vi, n))
    return builder.or_(builder.and_(flipped, _splat(builder, hmask, vi, n)), lanes)


def fold_two_lowest(builder, m1, m2, q):
    """IR: the two smallest per lane (``m1 <= m2``, ``<16 x i32>``) after group ``q`` joins them."""
    hi = builder.select(builder.icmp_signed(">", m1, q), m1, q)
    return builder.select(builder.icmp_signed("<", q, m1), q, m1), builder.select(builder.icmp_signed("<", hi, m2),
                                                                                   hi, m2)


def spread_min(builder, m):
    """IR: a ``<16 x i32>`` holding the smallest lane of ``m`` in every lane (LLVM's reduction, then a broadcast),
    so that a compare of every lane with it (:func:`vset_lowest`, the near bound) needs no lane number."""
    return _splat(builder, _ireduce_min(builder, m, 16), ir.VectorType(_I32, 16), 16)


def lowest_parts(builder, p, n):
    """IR, from ``n`` packed keys ``p`` (``n`` a multiple of 16): ``(m1, m2, gv)``, the two smallest per lane of the
    groups of 16 folded together (``m2`` None where ``n`` is 16) and the smallest of all in every lane of ``gv``."""
    v16 = ir.VectorType(_I32, 16)
    m1 = builder.shuffle_vector(p, p, ir.Constant(v16, list(range(16))))
    m2 = ir.Constant(v16, [2**31 - 1] * 16) if n > 16 else None
    for g in range(1, n // 16):
        m1, m2 = fold_two_lowest(builder, m1, m2,
                                 builder.shuffle_vector(p, p, ir.Constant(v16, list(range(16 * g, 16 * g + 16)))))
    return m1, m2, spread_min(builder, m1)


def lowest_and_near(builder, m1, m2, gv, hmask, d):
    """IR, from :func:`lowest_parts`: the smallest packed key, as i64, with bit 32 set where another is at most
    ``((smallest & hmask) + d) | ~hmask``: a second lane of ``m1`` (keys differ in the lane bits: one lane holds the
    smallest) or any lane of ``m2``. The bound is computed on ``gv`` in every lane."""
    v16 = ir.VectorType(_I32, 16)
    i16 = ir.IntType(16)
    vthr = builder.or_(builder.add(builder.and_(gv, _splat(builder, hmask, v16, 16)), _splat(builder, d, v16, 16)),
                       _splat(builder, builder.not_(hmask), v16, 16))
    b = builder.bitcast(builder.icmp_signed("<=", m1, vthr), i16)
    near = builder.and_(b, builder.sub(b, ir.Constant(i16, 1)))
    if m2 is not None:
        near = builder.or_(near, builder.bitcast(builder.icmp_signed("<=", m2, vthr), i16))
    any_near = builder.icmp_unsigned("!=", near, ir.Constant(i16, 0))
    g = builder.extract_element(gv, ir.Constant(_I32, 0))
    return builder.or_(builder.zext(g, _I64), builder.shl(builder.zext(any_near, _I64), ir.Constant(_I64, 32)))


def _lane_keys(builder, R, L, t1, hmask, n):
    return packed_lfru_keys(builder, R, L, t1, hmask, ir.Constant(ir.VectorType(_I32, n), list(range(n))), n)


@intrinsic
def vlowest(typingctx, R, L, t1, hmask, d):
    """The smallest packed key of ``n`` lanes, and in bit 32 whether another lies within ``d`` float32 units in
    the last place above it: lane ``s``'s key from ``R[s] * (t1 - L[s])`` (:func:`packed_lfru_keys`, ``R`` the
    reciprocal counts), its low bits (``~hmask``) replaced by ``s``; another lies within when its packed key is at
    most ``((smallest & hmask) + d) | ~hmask``. :func:`._kernels_seq.lfru_lowest` on vectors in registers: the lanes
    folded into groups of 16 keeping the two smallest per lane, the smallest of those spread to every lane, one
    compare."""
    sig = types.int64(R, L, types.float32, types.int32, types.int32)

    def codegen(context, builder, signature, args):
        R, L, t1, hmask, d = args
        n = signature.args[0].n
        return lowest_and_near(builder, *lowest_parts(builder, _lane_keys(builder, R, L, t1, hmask, n), n), hmask, d)

    return sig, codegen


@intrinsic
def vset_lowest(typingctx, V, R, L, t1, hmask, x):
    """``V`` with ``x`` in the lane of the smallest packed key of ``R`` / ``L`` (:func:`vlowest`'s, the same
    arguments): one compare of the keys with the smallest in every lane, no lane number through a scalar. Beside
    :func:`vlowest` on the same values LLVM computes the keys and the smallest once."""
    sig = V(V, R, L, types.float32, types.int32, types.float32)

    def codegen(context, builder, signature, args):
        V, R, L, t1, hmask, x = args
        n = signature.args[0].n
        p = _lane_keys(builder, R, L, t1, hmask, n)
        gv = lowest_parts(builder, p, n)[2]
        gn = builder.shuffle_vector(gv, gv, ir.Constant(ir.VectorType(_I32, n), [i % 16 for i in range(n)]))
        return builder.select(builder.icmp_signed("==", p, gn), _splat(builder, x, ir.VectorType(_F32, n), n), V)

    return sig, codegen


@intrinsic
def ilowest(typingctx, K):
    """The smallest lane of an :class:`I32Vec` (signed), as int64."""
    sig = types.int64(K)

    def codegen(context, builder, signature, args):
        return builder.sext(_ireduce_min(builder, args[0], signature.args[0].n), _I64)

    return sig, codegen


def _ireduce_min(builder, K, n):
    """IR: the smallest of ``n`` int32 lanes (LLVM's reduction)."""
    vt = ir.VectorType(_I32, n)
    red = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, [vt]),
                                         f"llvm.vector.reduce.smin.v{n}i32")
    return builder.call(red, [K])


def _iset_at_lowest(builder, V, K, xs, n):
    g = _splat(builder, _ireduce_min(builder, K, n), ir.VectorType(_I32, n), n)
    return builder.select(builder.icmp_signed("==", K, g), xs, V)


@intrinsic
def iset_lowest(typingctx, V, K, x):
    """``V`` (an :class:`I32Vec`) with ``x`` (int32) in the lane of ``K``'s smallest (``K``'s lanes differ: each holds
    its lane's index in its low bits): one compare of ``K`` with its smallest in every lane, no lane number through
    a scalar. Beside :func:`ilowest` of the same ``K`` LLVM reduces once."""
    sig = V(V, K, types.int32)

    def codegen(context, builder, signature, args):
        n = signature.args[0].n
        return _iset_at_lowest(builder, args[0], args[1], _splat(builder, args[2], ir.VectorType(_I32, n), n), n)

    return sig, codegen


@intrinsic
def ikey_lowest(typingctx, K, x):
    """:func:`iset_lowest` of ``K`` itself with ``x | lane`` (a packed key, its low bits the lane's index)."""
    sig = K(K, types.int32)

    def codegen(context, builder, signature, args):
        n = signature.args[0].n
        vt = ir.VectorType(_I32, n)
        xs = builder.or_(_splat(builder, args[1], vt, n), ir.Constant(vt, list(range(n))))
        return _iset_at_lowest(builder, args[0], args[0], xs, n)

    return sig, codegen


def _lanes_where(builder, op, K, x, n):
    """IR: an ``n``-bit mask of the int32 lanes of ``K`` for which ``lane op x`` holds (``x`` int64, within int32's
    range), lane 0 its lowest bit."""
    return builder.bitcast(_cmp_splat(builder, op, K, x, n), ir.IntType(n))


@intrinsic
def icount_le(typingctx, K, x):
    """How many lanes of an :class:`I32Vec` are at most ``x`` (int64, within int32's range): one compare, a
    population count."""
    sig = types.int64(K, types.int64)

    def codegen(context, builder, signature, args):
        n = signature.args[0].n
        iw = ir.IntType(n)
        b = _lanes_where(builder, "<=", args[0], args[1], n)
        pop = cgutils.get_or_insert_function(builder.module, ir.FunctionType(iw, [iw]), f"llvm.ctpop.i{n}")
        return builder.zext(builder.call(pop, [b]), _I64)

    return sig, codegen


@intrinsic
def ifind(typingctx, T, x):
    """The first lane of an :class:`I32Vec` that holds ``x`` (int64, within int32's range), or -1: one compare, a
    count of trailing zeros."""
    sig = types.int64(T, types.int64)

    def codegen(context, builder, signature, args):
        n = signature.args[0].n
        iw = ir.IntType(n)
        b = _lanes_where(builder, "==", args[0], args[1], n)
        tz = cgutils.get_or_insert_function(builder.module, ir.FunctionType(iw, [iw, ir.IntType(1)]),
                                            f"llvm.cttz.i{n}")
        lane = builder.zext(builder.call(tz, [b, ir.Constant(ir.IntType(1), 0)]), _I64)
        return builder.select(builder.icmp_unsigned("==", b, ir.Constant(iw, 0)), ir.Constant(_I64, -1), lane)

    return sig, codegen
