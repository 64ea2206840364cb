"""Where the replay kernels' state arrays lie: on whole cache lines, and no list across a page boundary.

The kernels write lists (the slots below a cut, a band's values, the leaving slots) by whole 64-byte vector
stores at data-dependent offsets, and read them back 16 lanes at a time. A store or load that straddles a
4 KiB page boundary costs several times one within a page, so where numpy's allocator happened to place a
list decided, process by process, whether the first entries, which nearly every event writes, straddle one.
A list whose first lanes straddled a page took 1.12x the global lfru slots loop's time, and a band buffer 1.23x
(per-layer lrfu) and 1.26x (per-layer lfru) theirs (docs/performance.md, *Lists that straddle a page*). The
kernels' wrappers take their arrays from :class:`Packed`: side by side as numpy's heap would place them, but
each on whole cache lines and none with its first bytes across a page boundary.
"""

from __future__ import annotations

import numpy as np

#: The page size the arrays are aligned to (x86-64 and most ARM64 Linux kernels; a larger page is a multiple).
PAGE = 4096


def _layout(shape: int | tuple[int, ...], dtype) -> tuple[tuple[int, ...], np.dtype, int]:
    """``shape`` as a tuple, ``dtype`` as a numpy dtype, and the bytes of such an array."""
    dt = np.dtype(dtype)
    shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(x) for x in shape)
    return shape, dt, int(np.prod(shape, dtype=np.int64)) * dt.itemsize


def page_aligned(shape: int | tuple[int, ...], dtype, fill=None, offset: int = 0) -> np.ndarray:
    """A C-contiguous array of ``shape`` and ``dtype`` whose data starts ``offset`` bytes (a multiple of 64 below
    :data:`PAGE`) past a :data:`PAGE` boundary, filled with ``fill`` (left uninitialised where ``None``). It keeps
    its over-allocated buffer alive as its ``base``.

    >>> a = page_aligned((3, 5), np.float32, 1.5)
    >>> a.ctypes.data % PAGE, a.shape, a.dtype, float(a.sum())
    (0, (3, 5), dtype('float32'), 22.5)
    >>> page_aligned(4, np.int32, 0, offset=192).ctypes.data % PAGE
    192
    """
    shape, dt, nbytes = _layout(shape, dtype)
    if offset % 64 or not 0 <= offset < PAGE:
        raise ValueError(f"offset {offset}: expected a multiple of 64 in [0, {PAGE})")
    raw = np.empty(nbytes + 2 * PAGE, dtype=np.uint8)
    start = (-raw.ctypes.data) % PAGE + offset
    out = raw[start:start + nbytes].view(dt).reshape(shape)
    if fill is not None:
        out.fill(fill)
    return out


def page_aligned_copy(a: np.ndarray, offset: int = 0) -> np.ndarray:
    """A copy of ``a`` (C order) in a :func:`page_aligned` array (``offset`` bytes past a page boundary).

    >>> b = page_aligned_copy(np.arange(6, dtype=np.int64).reshape(2, 3))
    >>> b.ctypes.data % PAGE, b.tolist()
    (0, [[0, 1, 2], [3, 4, 5]])
    """
    out = page_aligned(a.shape, a.dtype, None, offset)
    out[...] = a
    return out


class Packed:
    """Allocates arrays side by side in shared page-aligned chunks, each 64-byte aligned, none with its first
    :data:`HOT` bytes (all of a shorter one) across a page boundary: the layout of numpy's heap, packed into few
    pages, without a list that straddles one. An array of more than half a chunk gets a :func:`page_aligned` one.

    >>> pa = Packed()
    >>> a, b, c = pa(3, np.int64, 7), pa(1000, np.float32, 0), pa.copy(np.arange(5))
    >>> [x.ctypes.data % 64 for x in (a, b, c)], b.ctypes.data - a.ctypes.data, a.tolist(), c.tolist()
    ([0, 0, 0], 64, [7, 7, 7], [0, 1, 2, 3, 4])
    """

    #: Bytes at the start of an array that must lie on one page.
    HOT = 1024
    #: Bytes of a chunk.
    CHUNK = 16 * PAGE

    def __init__(self):
        self._chunk = None
        self._used = 0

    def _place(self, nbytes: int) -> tuple[np.ndarray, int]:
        """The buffer and the byte offset in it where an array of ``nbytes`` goes."""
        if nbytes > self.CHUNK // 2:
            return page_aligned(nbytes, np.uint8), 0
        off = -(-self._used // 64) * 64
        if off % PAGE + min(nbytes, self.HOT) > PAGE:
            off = -(-off // PAGE) * PAGE
        if self._chunk is None or off + nbytes > self.CHUNK:
            self._chunk = page_aligned(self.CHUNK, np.uint8)
            off = 0
        self._used = off + nbytes
        return self._chunk, off

    def __call__(self, shape: int | tuple[int, ...], dtype, fill=None) -> np.ndarray:
        """An array of ``shape`` and ``dtype`` at the next free place, filled with ``fill`` unless ``None``."""
        shape, dt, nbytes = _layout(shape, dtype)
        buf, off = self._place(nbytes)
        out = buf[off:off + nbytes].view(dt).reshape(shape)
        if fill is not None:
            out.fill(fill)
        return out

    def copy(self, a: np.ndarray) -> np.ndarray:
        """A copy of ``a`` (C order) at the next free place."""
        out = self(a.shape, a.dtype)
        out[...] = a
        return out
