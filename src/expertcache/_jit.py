"""The house numba decorators: caching, nogil and error model set in one place."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import numba
from numba.core import event as _event

from . import _notes

#: ``@njit`` with on-disk caching (first-call compile is paid once per machine),
#: the GIL released (kernels may run in threads) and numpy's error model.
jit = numba.njit(cache=True, nogil=True, error_model="numpy")

#: For small helpers called from kernel loops, which never allocate. Compiled
#: without the numba runtime (``_nrt=False``): a call then does no atomic
#: reference counting on its array arguments, which otherwise dominates a
#: replay loop (measured: 4x on LRU).
jit_helper = numba.njit(cache=True, nogil=True, error_model="numpy", _nrt=False)

#: :data:`jit_helper` inlined into its callers at numba's level: a call that LLVM leaves in a kernel loop passes
#: every array as its fields (a dozen pushes per call). For small helpers only, chosen by measurement
#: (docs/performance.md, *Calls out of the per-layer loops*): the same inlining made larger loops slower
#: (per-layer lrfu 1.11x with every helper inlined, 1.7x with its cut pass).
jit_inline = numba.njit(cache=True, nogil=True, error_model="numpy", _nrt=False, inline="always")

#: For kernel loops that never allocate (their arrays all passed in): compiled without the numba runtime, as
#: :data:`jit_helper`. Under :data:`jit`, each helper inlined at numba's level (:data:`jit_inline`) takes its
#: array arguments as new references, an ``NRT_incref`` / ``NRT_decref`` call pair (atomic) per array per event:
#: per-layer ``lru`` 0.91-0.97 and ``lfru`` 0.92-0.95 of the time without them on the AMD core (docs/performance.md,
#: *Session 32*). Such a loop cannot return an array, and numba rejects one that allocates.
jit_loop = numba.njit(cache=True, nogil=True, error_model="numpy", _nrt=False)


#: The note :data:`._notes.compile_note` switches on.
COMPILE_NOTE = ("expertcache: compiling kernels for this machine at their first use (20-40 s in all on a first run; "
                "later runs load them from the cache)")


class _OurCompiles(_event.Listener):
    """A listener of numba's ``numba:compile`` events (broadcast only where no cached copy was found) that calls
    :meth:`started` when an expertcache kernel starts to compile."""

    def on_start(self, event) -> None:
        func = getattr(event.data.get("dispatcher"), "py_func", None)
        if str(getattr(func, "__module__", "")).startswith("expertcache"):
            self.started()

    def on_end(self, event) -> None:
        pass

    def started(self) -> None:
        raise NotImplementedError


class _FirstCompile(_OurCompiles):
    """Prints :data:`COMPILE_NOTE` on stderr once a process, when an expertcache kernel starts to compile, where
    :data:`._notes.compile_note` is on."""

    said = False

    def started(self) -> None:
        if _notes.compile_note and not _FirstCompile.said:
            _FirstCompile.said = True
            print(COMPILE_NOTE, file=sys.stderr, flush=True)


_event.register("numba:compile", _FirstCompile())


class _Compiles(_OurCompiles):
    """Counts the expertcache kernels that start to compile."""

    def __init__(self) -> None:
        self.count = 0

    def started(self) -> None:
        self.count += 1


@contextmanager
def counting_compiles() -> Iterator[_Compiles]:
    """``with counting_compiles() as seen: ...``: ``seen.count`` is how many expertcache kernels compiled inside the
    block (0 where every one came from the on-disk cache). A caller can tell a first run, whose kernels compile,
    from a later one, and spread the rest of its work over processes that compile in parallel."""
    seen = _Compiles()
    with _event.install_listener("numba:compile", seen):
        yield seen
