"""``--host-tier mmap``: the model is built without its routed experts, which are read from the mapped file.

Independent checks: every architecture's mapped run equals the full-load run (``from_pretrained``,
the experts copied to RAM: the path tests/test_execute_run.py checks against plain ``generate``) in
tokens, logits (bit for bit), per-layer hits and misses, the per-event log and the copies made; the
expert parameters are never allocated; and a process whose data segment may grow by less than the
model's expert bytes runs the mapped model while the full load fails (benchmarks/bench_host_tier.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from expertcache.cli import main  # noqa: E402
from expertcache.collect import CollectConfig  # noqa: E402
from expertcache.collect.runner import load_weights  # noqa: E402
from expertcache.execute import ExecuteConfig  # noqa: E402
from expertcache.execute.checkpoint import UnmappableCheckpoint, _expert_layout, load_offloaded  # noqa: E402
from expertcache.execute.runner import Executor  # noqa: E402
from expertcache.execute.tiny import ARCH, prompt_ids, save_model_dir, write_prompts  # noqa: E402

IDS = [f"r{i}" for i in range(6)]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("hosttier")
    return {arch: save_model_dir(arch, base / arch) for arch in ARCH}


def _pair(d, contract):
    cfg = ExecuteConfig(policy="lru", rho=0.25, batch=4, max_new_tokens=4, contract=contract)
    full = Executor(load_weights(str(d), CollectConfig()), cfg, eos_token_ids=[1], keep_logits=True)
    model, host = load_offloaded(d)
    mapped = Executor(model, cfg, eos_token_ids=[1], keep_logits=True, host=host)
    return full.run(prompt_ids(), IDS), mapped.run(prompt_ids(), IDS)


@pytest.mark.parametrize("arch", list(ARCH))
def test_mapped_run_equals_full_load(model_dirs, arch):
    for contract in (("fused", "serialized") if arch == "qwen3_moe" else ("fused",)):
        a, b = _pair(model_dirs[arch], contract)
        assert b.memory["host_tier"] == "mmap" and a.memory["host_tier"] == "ram"
        assert b.generated == a.generated
        assert len(b.logits) == len(a.logits) and all(torch.equal(x, y) for x, y in zip(a.logits, b.logits,
                                                                                         strict=True))
        assert [x.to_dict() for x in b.per_layer] == [x.to_dict() for x in a.per_layer]
        assert b.event_log.tolist() == a.event_log.tolist()
        assert b.transfers_copied == a.transfers_copied == b.transferred > 0
        assert b.memory["host_expert_bytes"] == a.memory["host_expert_bytes"]
        assert b.memory["device_expert_bytes"] == a.memory["device_expert_bytes"]
        assert b.memory["device_non_expert_bytes"] == a.memory["device_non_expert_bytes"]


def test_experts_are_never_allocated(model_dirs):
    d = model_dirs["mixtral"]       # legacy per-expert names w1/w3/w2 under block_sparse_moe
    model, host = load_offloaded(d)
    full = load_weights(str(d), CollectConfig())
    experts = {n: p for n, p in model.named_parameters() if ".experts." in n}
    assert experts and all(p.is_meta for p in experts.values())
    assert not any(p.is_meta for n, p in model.named_parameters() if ".experts." not in n)
    # the host tier's pieces are the file's bytes: expert e of layer l equals the loaded stacked tensor
    ref = dict(full.named_parameters())
    for layer, mod in enumerate(sorted({n.rsplit(".", 1)[0] for n in experts})):
        for e in (0, 7):
            for name, pieces in host.block(layer, e).items():
                assert torch.equal(torch.cat(pieces, dim=0), ref[f"{mod}.{name}"][e])
    assert host.nbytes == sum(p.numel() * p.element_size() for p in experts.values())


def test_unmappable_checkpoints(tmp_path):
    with pytest.raises(UnmappableCheckpoint, match="local model directory"):
        load_offloaded(tmp_path)

    class Transpose:
        dim = 1

    class Conv:
        source_patterns = ["mlp.experts.*.gate_proj.weight"]
        target_patterns = ["mlp.experts.gate_up_proj"]
        operations = [Transpose()]

    with pytest.raises(UnmappableCheckpoint, match="converted by Transpose"):
        _expert_layout("m.experts", "gate_up_proj", torch.Size([2, 4, 3]), {}, [Conv()], 2, "x")


def test_auto_falls_back_to_ram_and_mmap_refuses(tmp_path, model_dirs, monkeypatch):
    import expertcache.execute.checkpoint as ck

    def refuse(model_dir, dtype="auto"):
        raise UnmappableCheckpoint("a layout this test refuses", field="host_tier")

    monkeypatch.setattr(ck, "load_offloaded", refuse)
    p = write_prompts(tmp_path / "p.jsonl")
    args = ["execute", str(model_dirs["olmoe"]), "--prompts", str(p), "--rho", "0.25", "-B", "2",
            "--max-new-tokens", "2", "--no-chat-template", "--no-reference", "--json"]
    r = CliRunner().invoke(main, args + ["-o", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    run_ = json.loads(r.output)["runs"][0]
    assert run_["memory_host_tier"] == "ram" and "refuses" in run_["memory_host_tier_fallback"]
    r = CliRunner().invoke(main, args + ["-o", str(tmp_path / "b"), "--host-tier", "mmap"])
    assert r.exit_code == 2 and "refuses" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_runs_under_a_memory_limit_smaller_than_its_experts():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_host_tier.py"), "--layers", "4",
                        "--limit-mb", "48", "--new-tokens", "2", "--json"], capture_output=True, text=True,
                       timeout=900)
    report = json.loads(r.stdout.splitlines()[-1])
    mmap_run, ram_limited, ram = report["runs"]
    assert report["expert_bytes"] > 48 * 2**20 * 1.5
    assert mmap_run["ran"], mmap_run
    assert not ram_limited["ran"]                 # the limit bites: the full load cannot run under it
    assert ram["ran"] and report["mmap_equals_ram"]
    assert r.returncode == 0
