"""``benchmarks/lrfu_members.py``: every form of per-layer lrfu's member loop leaves the shipped form's state."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "lrfu_members.py"


def _run(*extra: str, script: Path = SCRIPT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), "--steps", "4", "--pairs", "2", "--processes", "1", *extra],
                          capture_output=True, text=True, timeout=600)


def test_every_form_gets_a_row_and_the_timing_only_one_says_so():
    r = _run()
    assert r.returncode == 0, r.stderr
    rows = {ln.split()[0]: ln for ln in r.stdout.splitlines() if ln.startswith("  ")}
    assert set(rows) >= {"lane-table", "no-compare", "lane-order", "record", "gather-scatter", "no-value-store",
                         "shipped"}
    assert not rows["lane-table"].endswith("timing only")
    assert rows["no-value-store"].endswith("timing only")
    assert not rows["record"].endswith("timing only")
    assert r.stdout.startswith("machine: ")


def test_a_form_that_leaves_other_values_ends_the_run(tmp_path):
    text = SCRIPT.read_text()
    wrong = "                V[j] = np.float32(s * qu)\n            unit_bits(PL, pbase, u, ev)"
    head, form = text.split("    def lane_order(", 1)
    assert form.count(wrong) >= 1            # the lane-order form's value store (the first after its def)
    form = form.replace(wrong, wrong.replace("s * qu", "s * qu * 2.0"), 1)
    (tmp_path / "lrfu_members.py").write_text(head + "    def lane_order(" + form)
    (tmp_path / "_ab.py").write_text((ROOT / "benchmarks" / "_ab.py").read_text())
    (tmp_path / "bench_vs_libcachesim.py").write_text((ROOT / "benchmarks" / "bench_vs_libcachesim.py").read_text())
    r = _run(script=tmp_path / "lrfu_members.py")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "lane-order: the CRFs, last units or values differ" in r.stderr
