"""Bit intrinsics for the numba kernels of every stage (events, replay): LLVM's own instructions, no numpy."""

from __future__ import annotations

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
