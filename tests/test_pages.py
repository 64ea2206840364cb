"""Page-aligned state arrays (``replay/_pages.py``): where they lie, and that no count depends on it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from expertcache.replay import _kernels_bits as KB
from expertcache.replay import _kernels_lfru_groups as KG
from expertcache.replay import _kernels_lfru_slots as KS
from expertcache.replay import engine
from expertcache.replay._pages import PAGE, Packed, page_aligned, page_aligned_copy

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "placement.py"


@pytest.mark.parametrize("dtype", [np.int32, np.uint64, np.float32, np.float64, np.int16])
@pytest.mark.parametrize("shape", [1, 7, 4096, (3, 5), (0,)])
def test_page_aligned_starts_where_asked_and_is_filled(dtype, shape):
    for offset in (0, 64, 192, PAGE - 64):
        a = page_aligned(shape, dtype, 3, offset)
        assert a.ctypes.data % PAGE == offset or a.size == 0         # an empty array's pointer is numpy's
        assert a.dtype == np.dtype(dtype) and a.shape == ((shape,) if isinstance(shape, int) else shape)
        assert a.flags.c_contiguous and a.flags.writeable
        assert (a == 3).all()


@pytest.mark.parametrize("offset", [-64, 32, PAGE, PAGE + 64])
def test_an_offset_off_the_grid_is_refused(offset):
    with pytest.raises(ValueError, match="multiple of 64"):
        page_aligned(4, np.float64, None, offset)


def test_a_copy_holds_the_values_and_outlives_its_buffer():
    src = np.arange(12, dtype=np.int64).reshape(3, 4)
    b = page_aligned_copy(src, 128)
    del src
    assert b.ctypes.data % PAGE == 128 and b.tolist() == np.arange(12).reshape(3, 4).tolist()


def test_packed_places_side_by_side_on_whole_lines_and_no_start_across_a_page():
    rng = np.random.default_rng(0)
    for _ in range(20):
        pa = Packed()
        arrays = []
        for _ in range(40):
            n = int(rng.choice([1, 2, 8, 80, 144, 1408, 6144, 50000]))
            dt = rng.choice([np.int32, np.float32, np.float64, np.uint64, np.int16])
            a = pa(n, dt, 1) if rng.random() < 0.8 else pa.copy(np.full(n, 1, dt))
            assert a.ctypes.data % 64 == 0 and a.shape == (n,) and (a == 1).all()
            start = a.ctypes.data % PAGE
            assert start + min(a.nbytes, Packed.HOT) <= PAGE          # its first bytes on one page
            arrays.append(a)
        spans = sorted((a.ctypes.data, a.ctypes.data + a.nbytes) for a in arrays)
        assert all(e0 <= s1 for (_, e0), (s1, _) in zip(spans[:-1], spans[1:], strict=True))   # none overlap
        for k, a in enumerate(arrays):                 # each keeps its own values
            a.fill(k)
        assert all((a == k).all() for k, a in enumerate(arrays))
    pa = Packed()
    a, b = pa(4, np.int64, 0), pa(4, np.int64, 0)
    assert a.ctypes.data % PAGE == 0 and b.ctypes.data - a.ctypes.data == 64        # packed, not a page each
    c = pa(PAGE // 4 - 200, np.int32, 0)               # 3296 bytes from 128: the next starts 640 bytes before the end
    d = pa(300, np.int32, 0)                           # its first 1 KiB would cross it: the next page
    assert c.ctypes.data % PAGE == 128 and d.ctypes.data % PAGE == 0 and d.ctypes.data - a.ctypes.data == PAGE


class _Random:
    """An allocator that puts every array at a random multiple of 64 bytes into its page, the last 64 bytes of a
    page included (its first lanes then straddle two pages)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def _off(self) -> int:
        return int(self.rng.choice([PAGE - 64, PAGE - 128, int(self.rng.integers(0, PAGE // 64)) * 64]))

    def __call__(self, shape, dtype, fill=None):
        return page_aligned(shape, dtype, fill, self._off())

    def copy(self, a):
        return page_aligned_copy(a, self._off())


def _stream(seed: int, L: int = 3, N: int = 70, events: int = 300):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 24, events)
    offsets = np.zeros(events + 1, np.int64)
    offsets[1:] = np.cumsum(sizes)
    expert = np.concatenate([np.sort(rng.choice(N, k, replace=False, p=None)) for k in sizes]).astype(np.int16)
    layer = rng.integers(0, L, events).astype(np.int32)
    return offsets, expert, layer, N, L


@pytest.mark.parametrize("kernel", ["lrfu", "lfru", "slots", "groups"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_count_depends_on_where_the_arrays_lie(kernel, seed):
    offsets, expert, layer, N, L = _stream(seed)
    tie = engine._tie_ranks("random", seed, L * N)
    _, tie_pos = engine._tie_order(tie, L, N)
    out = []
    for pages in (None, _Random(seed), _Random(seed + 10)):
        hits, misses = np.zeros(L, np.int64), np.zeros(L, np.int64)
        flags = np.zeros(expert.shape[0], np.uint8)
        if kernel == "slots":
            KS.replay_lfru_slots(offsets, expert, layer, N, L, np.array([40]), tie, 0, hits, misses, flags,
                                 pages=pages)
        elif kernel == "groups":
            KG.replay_lfru_groups(offsets, expert, layer, N, L, True, np.array([40]), tie, 0, hits, misses, flags,
                                  pages=pages)
        elif kernel == "lrfu":
            KB.replay_lrfu_bits(offsets, expert, layer, N, L, np.array([9, 20, 33]), tie_pos, 0.3, 0, hits, misses,
                                flags, pages=pages)
        else:
            KB.replay_lfru_bits(offsets, expert, layer, N, L, np.array([9, 20, 33]), tie_pos, 0, hits, misses, flags,
                                pages=pages)
        out.append((hits.tolist(), misses.tolist(), flags.tolist()))
    assert out[0] == out[1] == out[2]
    assert sum(out[0][0]) > 0 and sum(out[0][1]) > 0


def _run(*extra: str, script: Path = SCRIPT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), "--steps", "3", "--pairs", "1", "--random", "2", *extra],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("kernel", ["lrfu", "lfru", "slots", "groups"])
def test_the_benchmark_rows_one_array_at_a_page_end_at_a_time(kernel):
    import json

    r = _run("--kernel", kernel, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = out["at_page_end"]
    assert [x["array"] for x in rows] == list(range(len(rows))) and len(rows) >= 16
    assert all(x["ratio"] > 0 for x in rows) and out["random"]["n"] == 2 and out["numpy"] > 0
    assert any(x["what"].startswith(("float32[", "float64[")) for x in rows)
    table = _run("--kernel", kernel)
    assert table.returncode == 0 and table.stdout.startswith("machine: ")
    assert "64 bytes before a page end" in table.stdout and "2 random placements" in table.stdout
    assert "numpy's allocator (this process)" in table.stdout


def test_a_placement_that_changes_the_counts_ends_the_run(tmp_path):
    text = SCRIPT.read_text()
    wrong = "self._packed(shape, dtype, fill)"
    assert text.count(wrong) == 1                      # the arrays packed as shipped: one filled with a wrong value
    (tmp_path / "placement.py").write_text(text.replace(wrong, "self._packed(shape, dtype, None if fill is None "
                                                                "else fill + 1)"))
    (tmp_path / "_ab.py").write_text((ROOT / "benchmarks" / "_ab.py").read_text())
    (tmp_path / "bench_vs_libcachesim.py").write_text((ROOT / "benchmarks" / "bench_vs_libcachesim.py").read_text())
    r = _run("--kernel", "lrfu", script=tmp_path / "placement.py")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "the hits differ from the shipped placement's" in r.stderr


def test_bad_options_are_refused():
    r = _run("--rho", "0")
    assert r.returncode == 2 and "--rho" in r.stderr and "Traceback" not in r.stderr
