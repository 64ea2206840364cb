"""Bit intrinsics and index helpers for the numba kernels of every stage (events, replay)."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic


def _zeros_count(op: str):
    """An intrinsic counting the trailing (``op = "cttz"``) or leading (``"ctlz"``) zero bits of a non-zero
    uint64 with LLVM's instruction of that name."""

    @intrinsic
    def count(typingctx, x):
        sig = types.uint64(types.uint64)

        def codegen(context, builder, signature, args):
            return getattr(builder, op)(args[0], ir.Constant(ir.IntType(1), 1))

        return sig, codegen

    return count


#: Trailing zero bits of a non-zero uint64 (LLVM ``cttz``).
cttz = _zeros_count("cttz")
#: Leading zero bits of a non-zero uint64 (LLVM ``ctlz``).
ctlz = _zeros_count("ctlz")


@intrinsic
def popc(typingctx, x):
    """Number of set bits of a uint64 (LLVM ``ctpop``)."""
    sig = types.uint64(types.uint64)

    def codegen(context, builder, signature, args):
        return builder.ctpop(args[0])

    return sig, codegen


#: An unsigned index: numba then skips its negative-index wraparound (a shift, a mask and an add per access).
#: Used where an index comes from data (a layer, a tie position, a gathered lane); none is ever negative.
U = np.uint64
