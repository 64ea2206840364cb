"""The house numba decorators: caching, nogil and error model set in one place."""

from __future__ import annotations

import numba

#: ``@njit`` with on-disk caching (first-call compile is paid once per machine),
#: the GIL released (kernels may run in threads) and numpy's error model.
jit = numba.njit(cache=True, nogil=True, error_model="numpy")

#: For small helpers called from kernel loops, which never allocate. Compiled
#: without the numba runtime (``_nrt=False``): a call then does no atomic
#: reference counting on its array arguments, which otherwise dominates a
#: replay loop (measured: 4x on LRU).
jit_helper = numba.njit(cache=True, nogil=True, error_model="numpy", _nrt=False)

#: :data:`jit_helper` inlined into its callers at numba's level (a call passes every array as its fields).
jit_inline = numba.njit(cache=True, nogil=True, error_model="numpy", _nrt=False, inline="always")
