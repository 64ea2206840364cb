"""The bundled real routing (OLMoE-1B-7B-0924 through warp): bytes as published, reuse as its producers report,
and the README's import -> events build -> replay lines as written."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.trace import DECODE, read_trace
from expertcache.trace.examples import WARP_OLMOE_SHA256, example_warp_olmoe_trace, raw_example_path
from expertcache.trace.importers import import_warp_jsonl

ROOT = Path(__file__).resolve().parents[1]


def test_bundled_file_is_the_published_one_with_its_licence():
    path = raw_example_path("warp-olmoe")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == WARP_OLMOE_SHA256
    folder = path.parent
    assert "Apache License" in (folder / "LICENSE").read_text()
    assert (folder / "NOTICE").is_file()
    readme = (folder / "README.md").read_text()
    assert WARP_OLMOE_SHA256 in readme and "sqliteai/warp" in readme


def _raw_reuse(path: Path) -> float:
    """Plain Python, from the raw lines: mean over layers and consecutive steps of |S(t) & S(t+1)| / k."""
    steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps.sort(key=lambda s: s["tok"])
    total, count = 0.0, 0
    for a, b in zip(steps, steps[1:], strict=False):
        for la, lb in zip(a["layers"], b["layers"], strict=True):
            total += len(set(la) & set(lb)) / len(la)
            count += 1
    return total / count


def test_next_token_reuse_is_the_reported_43_5_percent():
    path = raw_example_path("warp-olmoe")
    raw = _raw_reuse(path)
    tr, rep = import_warp_jsonl(path)
    assert (tr.n_layers, tr.n_experts, tr.top_k, tr.n_tokens) == (16, 64, 8, 299)
    assert rep.n_experts_is_lower_bound and rep.inferred == ("top_k", "n_layers", "n_experts")
    assert tr.position.tolist() == list(range(1, 300)) and (tr.phase == DECODE).all() and tr.gates is None
    # from the imported trace, with numpy: consecutive decode rows of the one request
    e = tr.experts.astype(np.int64)
    hits = (e[1:, :, :, None] == e[:-1, :, None, :]).any(axis=3).sum(axis=2)  # |S(t+1) & S(t)| per layer
    imported = float((hits / tr.top_k).mean())
    assert round(raw, 3) == 0.435 and round(imported, 3) == 0.435  # the producers state 43.5%
    assert abs(raw - imported) < 1e-12
    assert example_warp_olmoe_trace().n_experts == 64


def _readme_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Real routing in", 1)[1]
    (block,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)[:1]
    return [line for line in block.splitlines() if line.strip()]


def test_readme_import_build_replay_lines_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    lines = _readme_block()
    assert [shlex.split(line)[1:3] for line in lines] == [["trace", "import"], ["events", "build"], ["replay", "olmoe_events"]]
    for line in lines:
        sub = re.search(r'"\$\((.*?)\)"', line)
        if sub:
            inner = runner.invoke(main, shlex.split(sub.group(1))[1:])
            assert inner.exit_code == 0, inner.output
            line = line.replace(sub.group(0), shlex.quote(inner.output.strip()))
        r = runner.invoke(main, shlex.split(line)[1:])
        assert r.exit_code == 0, (line, r.output)
    tr = read_trace(tmp_path / "olmoe_trace")
    assert tr.n_experts == 64 and tr.provenance["import"]["n_experts_is_lower_bound"] is False
    assert "lru" in r.output and "belady" in r.output


def test_inferred_n_caveat_beside_capacities_in_trace_info_and_events_info(tmp_path):
    runner = CliRunner()
    path = str(raw_example_path("warp-olmoe"))
    assert runner.invoke(main, ["trace", "import", path, "--format", "warp-jsonl", "-o", str(tmp_path / "t")]).exit_code == 0
    r = runner.invoke(main, ["trace", "info", str(tmp_path / "t")])
    lines = r.output.splitlines()
    i = next(j for j, line in enumerate(lines) if line.startswith("n_experts"))
    assert "lower bound" in lines[i + 1]
    info = json.loads(runner.invoke(main, ["trace", "info", str(tmp_path / "t"), "--json"]).output)
    assert "lower bound" in info["n_experts_caveat"]
    assert runner.invoke(main, ["events", "build", str(tmp_path / "t"), "-B", "1", "-o", str(tmp_path / "s")]).exit_code == 0
    r = runner.invoke(main, ["events", "info", str(tmp_path / "s")])
    lines = r.output.splitlines()
    i = next(j for j, line in enumerate(lines) if line.startswith("capacity_mean"))
    assert "lower bound" in lines[i + 1]
    info = json.loads(runner.invoke(main, ["events", "info", str(tmp_path / "s"), "--json"]).output)
    assert "lower bound" in info["capacity_caveat"]
    # with the real N given, no caveat
    assert runner.invoke(main, ["trace", "import", path, "--format", "warp-jsonl", "-N", "64",
                                "-o", str(tmp_path / "t64")]).exit_code == 0
    assert json.loads(runner.invoke(main, ["trace", "info", str(tmp_path / "t64"), "--json"]).output)[
        "n_experts_caveat"] is None
