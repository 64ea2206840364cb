"""A compiled scanner for this project's routes JSON Lines: the common shape of the file, at memory speed.

:func:`scan_routes` reads the records written the way this project and most hooks write them
(one flat object per line; keys ``request_id`` (a string without escapes), ``phase``, ``position``,
``layer``, ``experts``, optional ``gates`` and ``token_id``; any key order and whitespace). Integers are
parsed by the kernel; gate numbers are copied out as text and converted by pyarrow's float parser
(correctly rounded, as ``json.loads``). Anything else — another key, an escape, a nested value, a
malformed line — makes it return ``None`` so that the general readers take over and name the fault;
it never guesses.
"""

from __future__ import annotations

from pathlib import Path

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["scan_routes"]

# key ids: 0 request_id, 1 phase, 2 position, 3 layer, 4 experts, 5 gates, 6 token_id
_KEYS = [b"request_id", b"phase", b"position", b"layer", b"experts", b"gates", b"token_id"]
_KEY_BYTES = np.frombuffer(b"".join(_KEYS), np.uint8).copy()
_KEY_OFF = np.cumsum([0] + [len(k) for k in _KEYS]).astype(np.int64)


@numba.njit(cache=True)
def _ws(buf, i, n):
    while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
        i += 1
    return i


@numba.njit(cache=True)
def _int(buf, i, n):
    """(value, next index, ok) of a JSON integer at ``i`` (at most 18 digits)."""
    neg = False
    if i < n and buf[i] == 45:
        neg = True
        i += 1
    v = 0
    d = 0
    while i < n and 48 <= buf[i] <= 57:
        v = v * 10 + (buf[i] - 48)
        i += 1
        d += 1
    if d == 0 or d > 18:
        return 0, i, False
    if i < n and (buf[i] == 46 or buf[i] == 101 or buf[i] == 69):  # a fraction or exponent: not an integer
        return 0, i, False
    return (-v if neg else v), i, True


@numba.njit(cache=True)
def _str(buf, i, n):
    """(start, end, next index, ok) of a JSON string without escapes at ``i``."""
    if i >= n or buf[i] != 34:
        return 0, 0, i, False
    s = i + 1
    j = s
    while j < n and buf[j] != 34:
        if buf[j] == 92 or buf[j] < 32:
            return 0, 0, j, False
        j += 1
    if j >= n:
        return 0, 0, j, False
    return s, j, j + 1, True


@numba.njit(cache=True)
def _key(buf, s, e, kb, ko):
    for k in range(ko.shape[0] - 1):
        a, b = ko[k], ko[k + 1]
        if b - a == e - s:
            same = True
            for t in range(e - s):
                if buf[s + t] != kb[a + t]:
                    same = False
                    break
            if same:
                return k
    return -1


@numba.njit(cache=True)
def _is_null(buf, i, n):
    return i + 4 <= n and buf[i] == 110 and buf[i + 1] == 117 and buf[i + 2] == 108 and buf[i + 3] == 108


@numba.njit(cache=True)
def _grow(a, need):
    if need <= a.shape[0]:
        return a
    size = a.shape[0] * 2
    while size < need:
        size *= 2
    b = np.empty((size,) + a.shape[1:], a.dtype)
    b[:a.shape[0]] = a
    return b


@numba.njit(cache=True, nogil=True)
def _scan(buf, kb, ko, out_i, rid_off, rid_data, exv, goff, gdata, counts):
    """One pass over ``buf``, growing the outputs. Returns (0 or the 1-based line it cannot read, outputs...)."""
    fill = True
    n = buf.shape[0]
    i = 0
    line = 0
    rec = 0
    nex = 0
    ng = 0
    ngb = 0
    nrb = 0
    while i < n:
        line += 1
        j = _ws(buf, i, n)
        if j >= n:
            break
        if buf[j] == 10:
            i = j + 1
            continue
        end = j
        while end < n and buf[end] != 10:
            end += 1
        width = end - j
        if rec + 2 > out_i.shape[0]:
            out_i = _grow(out_i, rec + 2)
            rid_off = _grow(rid_off, rec + 3)
        if nex + width > exv.shape[0]:
            exv = _grow(exv, nex + width)
        if ng + width + 2 > goff.shape[0]:
            goff = _grow(goff, ng + width + 2)
        if ngb + width > gdata.shape[0]:
            gdata = _grow(gdata, ngb + width)
        if nrb + width > rid_data.shape[0]:
            rid_data = _grow(rid_data, nrb + width)
        if buf[j] != 123:
            return line, out_i, rid_off, rid_data, exv, goff, gdata
        j = _ws(buf, j + 1, n)
        seen = 0
        position = 0
        layer = 0
        phase = -1
        tok = -1
        ex_start = nex
        g_count = -1
        rs = 0
        re_ = 0
        while True:
            s, e, j, ok = _str(buf, j, n)
            if not ok:
                return line, out_i, rid_off, rid_data, exv, goff, gdata
            k = _key(buf, s, e, kb, ko)
            if k < 0 or (seen >> k) & 1:
                return line, out_i, rid_off, rid_data, exv, goff, gdata
            seen |= 1 << k
            j = _ws(buf, j, n)
            if j >= n or buf[j] != 58:
                return line, out_i, rid_off, rid_data, exv, goff, gdata
            j = _ws(buf, j + 1, n)
            if k == 0:
                rs, re_, j, ok = _str(buf, j, n)
                if not ok:
                    return line, out_i, rid_off, rid_data, exv, goff, gdata
            elif k == 1:
                s, e, j, ok = _str(buf, j, n)
                if not ok:
                    return line, out_i, rid_off, rid_data, exv, goff, gdata
                if e - s == 6 and buf[s] == 100 and buf[s + 1] == 101 and buf[s + 2] == 99 and buf[s + 3] == 111 \
                        and buf[s + 4] == 100 and buf[s + 5] == 101:
                    phase = 1
                elif e - s == 7 and buf[s] == 112 and buf[s + 1] == 114 and buf[s + 2] == 101 and buf[s + 3] == 102 \
                        and buf[s + 4] == 105 and buf[s + 5] == 108 and buf[s + 6] == 108:
                    phase = 0
                else:
                    return line, out_i, rid_off, rid_data, exv, goff, gdata
            elif k == 2 or k == 3 or k == 6:
                if k == 6 and _is_null(buf, j, n):
                    j += 4
                else:
                    v, j, ok = _int(buf, j, n)
                    if not ok:
                        return line, out_i, rid_off, rid_data, exv, goff, gdata
                    if k == 2:
                        position = v
                    elif k == 3:
                        layer = v
                    else:
                        tok = v
            elif k == 4 or k == 5:
                if k == 5 and _is_null(buf, j, n):
                    j += 4
                else:
                    if j >= n or buf[j] != 91:
                        return line, out_i, rid_off, rid_data, exv, goff, gdata
                    j = _ws(buf, j + 1, n)
                    cnt = 0
                    if j < n and buf[j] == 93:
                        j += 1
                    else:
                        while True:
                            if k == 4:
                                v, j, ok = _int(buf, j, n)
                                if not ok:
                                    return line, out_i, rid_off, rid_data, exv, goff, gdata
                                exv[nex] = v
                                nex += 1
                            else:
                                s = j
                                while j < n and ((48 <= buf[j] <= 57) or buf[j] == 46 or buf[j] == 45
                                                 or buf[j] == 43 or buf[j] == 101 or buf[j] == 69):
                                    j += 1
                                if j == s:
                                    return line, out_i, rid_off, rid_data, exv, goff, gdata
                                if fill:
                                    for t in range(s, j):
                                        gdata[ngb + t - s] = buf[t]
                                    goff[ng + 1] = ngb + j - s
                                ngb += j - s
                                ng += 1
                            cnt += 1
                            j = _ws(buf, j, n)
                            if j < n and buf[j] == 44:
                                j = _ws(buf, j + 1, n)
                                continue
                            if j < n and buf[j] == 93:
                                j += 1
                                break
                            return line, out_i, rid_off, rid_data, exv, goff, gdata
                    if k == 5:
                        g_count = cnt
            j = _ws(buf, j, n)
            if j < n and buf[j] == 44:
                j = _ws(buf, j + 1, n)
                continue
            if j < n and buf[j] == 125:
                j += 1
                break
            return line, out_i, rid_off, rid_data, exv, goff, gdata
        j = _ws(buf, j, n)
        if j < n and buf[j] != 10:
            return line, out_i, rid_off, rid_data, exv, goff, gdata
        if (seen & 31) != 31:
            return line, out_i, rid_off, rid_data, exv, goff, gdata
        if fill:
            out_i[rec, 0] = line
            out_i[rec, 1] = phase
            out_i[rec, 2] = position
            out_i[rec, 3] = layer
            out_i[rec, 4] = tok
            out_i[rec, 5] = nex - ex_start
            out_i[rec, 6] = g_count
            for t in range(rs, re_):
                rid_data[nrb + t - rs] = buf[t]
            rid_off[rec + 1] = nrb + re_ - rs
        nrb += re_ - rs
        rec += 1
        i = j + 1
    counts[0] = rec
    counts[1] = nex
    counts[2] = ng
    counts[3] = ngb
    counts[4] = nrb
    counts[5] = line
    return 0, out_i, rid_off, rid_data, exv, goff, gdata


def _scan_chunk(chunk: np.ndarray) -> tuple | None:
    """Scan one newline-aligned chunk; ``None`` where it holds a line the scanner cannot read."""
    counts = np.zeros(6, np.int64)
    guess = max(chunk.size // 200, 16)
    status, out_i, rid_off, rid_data, exv, goff, gdata = _scan(
        chunk, _KEY_BYTES, _KEY_OFF, np.empty((guess, 7), np.int64), np.zeros(guess + 1, np.int64),
        np.empty(guess * 8, np.uint8), np.empty(guess * 8, np.int64), np.zeros(guess * 8 + 1, np.int64),
        np.empty(guess * 64, np.uint8), counts)
    if status:
        return None
    n, nex, ng, ngb, nrb, lines = (int(c) for c in counts)
    return (out_i[:n], rid_off[:n + 1], rid_data[:nrb], exv[:nex], goff[:ng + 1], gdata[:ngb],
            (n, nex, ng, ngb, nrb, lines))


#: Files from this size on are cut into newline-aligned chunks scanned by parallel threads (the kernel
#: releases the GIL); the chunks' columns are joined in file order, line numbers continued.
_PARALLEL_MIN_BYTES = 32 << 20


def _scan_parallel(buf: np.ndarray) -> tuple | None:
    import os
    from concurrent.futures import ThreadPoolExecutor

    workers = min(os.cpu_count() or 1, 8) if buf.size >= _PARALLEL_MIN_BYTES else 1
    cuts = [0]
    for w in range(1, workers):
        at = int(buf.size * w // workers)
        nl = np.flatnonzero(buf[at:at + (1 << 20)] == 10)
        if nl.size == 0:
            workers = w
            break
        cuts.append(at + int(nl[0]) + 1)
    cuts.append(int(buf.size))
    chunks = [buf[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True) if b > a]
    if len(chunks) == 1:
        parts = [_scan_chunk(chunks[0])]
    else:
        with ThreadPoolExecutor(len(chunks)) as pool:
            parts = list(pool.map(_scan_chunk, chunks))
    if any(p is None for p in parts):
        return None
    if len(parts) == 1:
        return parts[0]
    # every chunk but the last ends just after a newline, so the lines a chunk went through are its newlines
    lines_before = np.cumsum([0] + [p[6][5] for p in parts[:-1]])
    out_i = np.concatenate([p[0] for p in parts])
    row = 0
    for p, before in zip(parts, lines_before, strict=True):
        out_i[row:row + p[6][0], 0] += before
        row += p[6][0]

    def joined_offsets(index: int, total_index: int) -> np.ndarray:
        pieces, base = [np.zeros(1, np.int64)], 0
        for p in parts:
            pieces.append(p[index][1:] + base)
            base += p[6][total_index]
        return np.concatenate(pieces)

    totals = tuple(int(sum(p[6][i] for p in parts)) for i in range(6))
    return (out_i, joined_offsets(1, 4), np.concatenate([p[2] for p in parts]),
            np.concatenate([p[3] for p in parts]), joined_offsets(4, 3), np.concatenate([p[5] for p in parts]),
            totals)


def scan_routes(path: str | Path) -> dict[str, np.ndarray | list[str] | None] | None:
    """Columns of a routes JSON Lines file in the common shape, or ``None`` where the general readers must read it.

    Returns ``line``, ``phase``, ``position``, ``layer``, ``token_id`` (``int64[n]``), ``ex_values``,
    ``ex_lengths``, ``gate_values`` (``float64``; ``None`` without gates), ``gate_lengths`` (-1 where a
    record has none), ``request`` (indices) and ``request_names`` (first-appearance order).
    """
    # read through a read-only memory map: the kernel reads the pages once, no copy of the file is made
    buf = np.asarray(np.memmap(path, dtype=np.uint8, mode="r"))
    if buf.size >= 3 and buf[0] == 0xEF and buf[1] == 0xBB and buf[2] == 0xBF:
        buf = buf[3:]
    parts = _scan_parallel(buf)
    if parts is None:
        return None
    out_i, rid_off, rid_data, exv, goff, gdata, (n, nex, ng, ngb, nrb, _) = parts
    del buf
    if n == 0:
        return None
    rid = pa.LargeStringArray.from_buffers(n, pa.py_buffer(rid_off), pa.py_buffer(rid_data[:nrb]))
    try:
        rid.validate(full=True)  # the bytes must be UTF-8
    except pa.ArrowInvalid:
        return None
    enc = rid.dictionary_encode()
    gate_values = None
    gl = out_i[:, 6].copy()
    if ng:
        text = pa.LargeStringArray.from_buffers(ng, pa.py_buffer(goff), pa.py_buffer(gdata[:ngb]))
        try:
            gate_values = pc.cast(text, pa.float64()).to_numpy(zero_copy_only=False)
        except pa.ArrowInvalid:
            return None
    elif (gl >= 0).any():
        gate_values = np.zeros(0, np.float64)
    return {"line": out_i[:, 0].copy(), "phase": out_i[:, 1].astype(np.int8), "position": out_i[:, 2].copy(),
            "layer": out_i[:, 3].copy(), "token_id": out_i[:, 4].copy(), "ex_values": exv[:nex],
            "ex_lengths": out_i[:, 5].copy(), "gate_values": gate_values, "gate_lengths": gl,
            "request": enc.indices.to_numpy(zero_copy_only=False).astype(np.int64),
            "request_names": enc.dictionary.to_pylist()}
