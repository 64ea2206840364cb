"""``benchmarks/kernel_ab.py``: a kernel against a copy of itself, and a folder that is not a checkout's src."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "benchmarks" / "kernel_ab.py")


def _run(baseline: Path, *extra: str, cache: Path | None = None) -> subprocess.CompletedProcess:
    """The script at 3 steps and 2 pairs; with ``cache``, its processes' numba cache kept there (``--cache-dir``)."""
    keep = ["--cache-dir", str(cache)] if cache else []
    return subprocess.run([sys.executable, SCRIPT, "--baseline", str(baseline), "--steps", "3", "--pairs", "2",
                           *keep, *extra], capture_output=True, text=True, timeout=900)


def _copy(dest: Path) -> Path:
    """A copy of this checkout's package under ``dest/src``; returns that src folder."""
    shutil.copytree(ROOT / "src" / "expertcache", dest / "src" / "expertcache",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dest / "src"


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> tuple[Path, Path]:
    """One copy of the checkout and one numba cache for the runs of this file: each side's kernels compile once,
    not once a run."""
    root = tmp_path_factory.mktemp("kernel_ab")
    return _copy(root), root / "numba"


@pytest.mark.parametrize("kernel", ("lfru", "lru-layers", *(pytest.param(k, marks=pytest.mark.long) for k in (
    "slots", "lfru-seq", "lfu-global-seq-in-cache", "lrfu-global-slots", "shuffle"))))   # (long: 5-50 s each)
def test_a_copy_of_this_checkout_gives_one_row_per_rho_with_its_range(shared, kernel):
    src, cache = shared
    processes = 2 if kernel == "lru-layers" else 1   # the pooling checked once (a process: imports, loads)
    r = _run(src, "--kernel", kernel, "--rhos", "0.2,0.4", "--processes", str(processes), cache=cache)
    assert r.returncode == 0, r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("  rho ")]
    assert [row[1] for row in rows] == ["0.2", "0.4"]
    for row in rows:
        med = float(row[2])
        lo, hi = (float(x) for x in row[3].strip("()").split("-"))
        assert 0 < lo <= med <= hi
    assert r.stderr.count("process ") == processes
    assert r.stdout.startswith("machine: ") and " CPUs" in r.stdout.splitlines()[0]   # figures name their machine
    assert not any(src.rglob("*.nbi"))      # compiled into the script's cache, not the checkout's


def test_a_folder_without_the_package_is_a_one_line_error(tmp_path):
    r = _run(tmp_path, "--kernel", "lru")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "expected a checkout's src folder" in r.stderr


def test_a_prototype_whose_counts_differ_is_refused_unless_timed_only(tmp_path, shared):
    kb = _copy(tmp_path) / "expertcache" / "replay" / "_kernels_bits.py"
    text = kb.read_text()
    call = "    _replay_lru_bits(offsets, expert, ev_layer, n_experts, n_layers, capacity, tie_pos, count_from, hits,"
    assert text.count(call) == 1
    kb.write_text(text.replace(call, "    hits[0] += 1\n" + call))      # the baseline counts one hit more
    refused = _run(tmp_path / "src", "--kernel", "lru", "--rhos", "0.2", "--processes", "1", cache=shared[1])
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "hits differ from the baseline's" in refused.stderr and "--timing-only" in refused.stderr
    timed = _run(tmp_path / "src", "--kernel", "lru", "--rhos", "0.2,0.4", "--processes", "1", "--timing-only",
                 cache=shared[1])
    assert timed.returncode == 0, timed.stderr
    rows = [ln for ln in timed.stdout.splitlines() if ln.startswith("  rho ")]
    assert len(rows) == 2 and all(ln.endswith("counts differ (--timing-only)") for ln in rows)


def test_sequential_kernels_need_them_on_both_sides(tmp_path):
    """A baseline from before the sequential loops (no replay/_kernels_seq.py): --kernel lfu-seq is a one-line
    error naming the file."""
    (_copy(tmp_path) / "expertcache" / "replay" / "_kernels_seq.py").unlink()
    r = _run(tmp_path / "src", "--kernel", "lfu-seq", "--rhos", "0.2", "--processes", "1")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "_kernels_seq.py" in r.stderr and "--kernel lfu-seq" in r.stderr


@pytest.mark.parametrize("flag, value, label, bad, refusal", [
    ("--batch", "64", "lfru, routed stream at batch 64, 3 steps", "-1",
     "--batch -1: a batch is at least 1 (0: the drifting stream)"),
    ("--experts", "256", "lfru, routed stream 48 x 256 at batch 8, 3 steps", "0",
     "--experts 0: a layer of the routed stream has 1 to 1024 experts")])
def test_the_routed_stream_by_batch_and_experts_and_a_bad_value_is_a_one_line_error(shared, flag, value, label, bad,
                                                                                    refusal):
    """--batch B: the rows name the routed stream at that batch; --experts N: the stream 48 x N (at batch 8 unless
    --batch says); a batch below 1 or a layer of no experts is refused in one line."""
    src, cache = shared
    r = _run(src, "--kernel", "lfru", "--rhos", "0.4", "--processes", "1", flag, value, cache=cache)
    assert r.returncode == 0, r.stderr
    assert label in r.stdout
    assert len([ln for ln in r.stdout.splitlines() if ln.startswith("  rho 0.4 ")]) == 1
    r = _run(src, "--kernel", "lfru", flag, bad)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].endswith(refusal)


def test_shuffled_members_for_a_sequential_kernel_and_a_one_line_refusal_otherwise(shared):
    """--shuffled: a sequential kernel's rows name the shuffled members; an event-atomic kernel is refused in one
    line (exit 2)."""
    src, cache = shared
    r = _run(src, "--kernel", "lru-seq", "--rhos", "0.1", "--processes", "1", "--shuffled", cache=cache)
    assert r.returncode == 0, r.stderr
    assert "lru-seq, members shuffled, 3 steps" in r.stdout
    assert len([ln for ln in r.stdout.splitlines() if ln.startswith("  rho 0.1 ")]) == 1
    r = _run(src, "--kernel", "lfru", "--shuffled")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--shuffled: expected a sequential kernel" in r.stderr.strip().splitlines()[-1]
