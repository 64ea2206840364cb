"""Notes the command line prints on stderr, switched on by it and read where they arise (no numba import here)."""

from __future__ import annotations

#: Say once on stderr that kernels compile for this machine at their first use (:mod:`._jit`). The command line
#: switches it on where stderr is a terminal and ``-q`` was not given; library use and captured stderr stay silent.
compile_note = False
