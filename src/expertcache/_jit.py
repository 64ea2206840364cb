"""The house numba decorator: caching, nogil and error model set in one place."""

from __future__ import annotations

import numba

#: ``@njit`` with on-disk caching (first-call compile is paid once per machine),
#: the GIL released (kernels may run in threads) and numpy's error model.
jit = numba.njit(cache=True, nogil=True, error_model="numpy")
