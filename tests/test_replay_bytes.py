"""``expertcache replay`` reports bytes moved and bytes per output token (hand-derived numbers)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from expertcache.analysis import output_tokens, replay_bytes
from expertcache.cli import main
from expertcache.events import EventStream


def _stream(tmp_path, provenance):
    # L=1, N=4, k=2; steps 0, 1, 2 with 1, 2, 3 active requests -> 1 + 2 + 3 = 6 output tokens.
    # rho 0.5 -> c = floor(0.5*4 + 0.5) = 2. LRU, ties by id: {0,1} 2 misses; {1,2} 1 hit, 1 miss,
    # keeps {1,2}; {0,1} 1 hit (block 1), 1 miss -> 4 transferred blocks.
    s = EventStream.from_lists(1, 4, 2, steps=[0, 1, 2], layers=[0, 0, 0], experts=[[0, 1], [1, 2], [0, 1]],
                               active=[1, 2, 3], provenance=provenance)
    s.save(tmp_path / "s")
    return str(tmp_path / "s")


def _run(*args):
    res = CliRunner().invoke(main, ["replay", *args, "--rho", "0.5", "--tie-break", "id", "--policy", "lru"])
    assert res.exit_code == 0, res.output
    return res.output


def test_bytes_from_the_trace_manifest(tmp_path):
    path = _stream(tmp_path, {"trace_provenance": {"expert_block_bytes": 1000}})
    row = json.loads(_run(path, "--json"))
    assert row["transferred"] == 4
    assert (row["expert_block_bytes"], row["bytes_moved"], row["output_tokens"]) == (1000, 4000, 6)
    assert row["bytes_per_output_token"] == 4000 / 6
    assert row["expert_block_bytes_source"] == "manifest expert_block_bytes"
    text = _run(path)
    assert "expert block 1,000 B (manifest expert_block_bytes); 6 output tokens" in text
    assert "B/token" in text and "667" in text and "0.004" in text      # 4000 B = 0.004 MB, 666.7 B/token


def test_expert_bytes_option_overrides_and_warmup_counts_only_counted_steps(tmp_path):
    path = _stream(tmp_path, {"expert_block_bytes": 1000})
    row = json.loads(_run(path, "--json", "--expert-bytes", "10"))
    assert (row["bytes_moved"], row["expert_block_bytes_source"]) == (40, "--expert-bytes")
    # warm-up of 1 event: it leaves the cache {0,1}; event 1 {1,2}: block 1 hits, block 2 misses (cache {1,2});
    # event 2 {0,1}: block 1 hits, block 0 misses -> 2 transferred blocks over the 2 + 3 = 5 tokens of steps 1, 2
    row = json.loads(_run(path, "--json", "--warmup-events", "1"))
    assert (row["transferred"], row["output_tokens"], row["bytes_moved"]) == (2, 5, 2000)
    assert row["bytes_per_output_token"] == 400.0


def test_no_block_size_reports_null_bytes(tmp_path):
    path = _stream(tmp_path, {})
    row = json.loads(_run(path, "--json"))
    assert row["bytes_moved"] is None and row["bytes_per_output_token"] is None and row["output_tokens"] == 6
    assert "B/token" not in _run(path)
    res = CliRunner().invoke(main, ["replay", path, "--expert-bytes", "-5"])
    assert res.exit_code == 2 and res.output.count("\n") == 1


def test_output_tokens_and_replay_bytes_by_hand():
    # two layers: a step's tokens count once, not once per layer
    s = EventStream.from_lists(2, 4, 1, steps=[0, 0, 3], layers=[0, 1, 1], experts=[[0], [1], [2, 3]],
                               active=[1, 1, 2])
    assert output_tokens(s) == 3 and output_tokens(s, 1) == 2 and output_tokens(s, 2) == 2
    b = replay_bytes(s, transferred=3, block_bytes=7, warmup_events=0)
    assert (b.bytes_moved, b.output_tokens, b.bytes_per_output_token) == (21, 3, 7.0)
