"""docs/prefetch.md's hidden-state paragraph: re-collected from the documented example-model weights, with
hidden states, the comparison prints every figure the paragraph quotes (slow; skipped without the weights)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_example_model_data import (
    MODEL,
    REBUILT_ROUTES_CONTENT_SHA256,
    _rebuilt_weights,
    routes_content_sha256,
)

ROOT = Path(__file__).resolve().parents[1]


def _compare(trace: Path, *extra: str) -> dict:
    from click.testing import CliRunner

    from expertcache.cli import main

    res = CliRunner().invoke(main, ["prefetch", "compare", str(trace), "-C", "8", *extra, "--json"])
    assert res.exit_code == 0, res.output
    return {r["name"]: r for r in json.loads(res.output.strip().splitlines()[-1])["rows"] if "hit" in r}


def _figures(r: dict) -> tuple[str, str, str]:
    return f"{100 * r['hit']:.2f}%", f"{100 * r['adj_hit']:.2f}%", f"{r['load_per_token'] / 1e6:.3f} MB/token"


@pytest.mark.slow
@pytest.mark.skipif(not _rebuilt_weights(), reason="models/example-moe (git-ignored) absent or not the pinned "
                    "rebuild; python scripts/example_model/make_all.py --skip-record builds it")
def test_hidden_state_paragraph_is_what_the_commands_print(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "emt_hidden"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "2"}
    subprocess.run([sys.executable, "-m", "expertcache", "collect", str(MODEL), "--prompts",
                    str(ROOT / "src/expertcache/data/example_prompts.jsonl"), "-o", str(out), "--max-new-tokens",
                    "64", "--save-hidden"], check=True, env=env, cwd=ROOT, capture_output=True)
    assert routes_content_sha256(out) == REBUILT_ROUTES_CONTENT_SHA256        # "the routes come out identical"
    plain = _compare(ROOT / "src/expertcache/data/example_model_trace")
    hidden, ahead = _compare(out), _compare(out, "--lookahead", "1")
    text = (ROOT / "docs" / "prefetch.md").read_text()
    para = " ".join(text[text.index("With hidden states:"):text.index("### Scale")].split())
    pro, fine = hidden["promoe"], hidden["finemoe"]
    assert f"(d = 3, {pro['added_params']:,} parameters) Hit {_figures(pro)[0]}, AdjHit {_figures(pro)[1]}, " \
           f"{_figures(pro)[2]} (routing stand-in: {100 * plain['promoe']['adj_hit']:.2f}%, " \
           f"{plain['promoe']['load_per_token'] / 1e6:.3f})" in para
    assert f"Hit {_figures(fine)[0]}, AdjHit {_figures(fine)[1]}, {_figures(fine)[2]} (stand-in: " \
           f"{100 * plain['finemoe']['adj_hit']:.2f}%, {plain['finemoe']['load_per_token'] / 1e6:.3f})" in para
    for name in set(hidden) - {"promoe", "finemoe"}:                               # "the other rows are unchanged"
        assert _figures(hidden[name]) == _figures(plain[name]), name
    la = ahead["promoe"]
    assert f"reaches Hit {_figures(la)[0]} but AdjHit {_figures(la)[1]} at {_figures(la)[2]} " \
           f"({la['useful_prefetches']:,} of its {la['proactive_loads']:,} proactive loads used)" in para
    lfu = hidden["lfu"]
    assert max((r for r in hidden.values() if r["family"] != "reference"), key=lambda r: r["adj_hit"]) is lfu
    assert f"AdjHit {_figures(lfu)[1]}, {_figures(lfu)[2]}" in para
    assert re.search(r"collect models/example-moe .* --save-hidden", para)
