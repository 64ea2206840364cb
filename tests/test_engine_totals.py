"""``benchmarks/engine_totals.py``: the engine's one-pass totals against the bincounts they replaced."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "engine_totals.py"


def _run(script: Path = SCRIPT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), "--steps", "6", "--pairs", "2"], capture_output=True,
                          text=True, timeout=600)


def test_rows_name_both_sides_and_the_ratio():
    r = _run()
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("machine: ")
    assert any(ln.strip().startswith("one pass") for ln in lines)
    assert any(ln.strip().startswith("bincounts") for ln in lines)
    assert "pass / bincounts: min" in lines[-1]


def test_totals_that_differ_end_the_run(tmp_path):
    text = SCRIPT.read_text()
    wrong = "weights=stream.logical_per_event[start:], minlength=L)"
    assert text.count(wrong) == 1
    (tmp_path / "engine_totals.py").write_text(text.replace(wrong, wrong.replace("[start:]", "[start:] + 1")))
    (tmp_path / "_ab.py").write_text((ROOT / "benchmarks" / "_ab.py").read_text())
    (tmp_path / "bench_vs_libcachesim.py").write_text((ROOT / "benchmarks" / "bench_vs_libcachesim.py").read_text())
    r = _run(script=tmp_path / "engine_totals.py")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "the totals differ from the bincounts'" in r.stderr
