"""A model whose expert weights exceed the process's memory limit still runs with ``--host-tier mmap``.

    python benchmarks/bench_host_tier.py                       # 201 MB of experts, limit +96 MB
    python benchmarks/bench_host_tier.py --layers 16 --json    # 403 MB of experts

Model: a random-init transformers ``Qwen3MoeForCausalLM`` that is narrow but has many experts
(``--layers`` 8, d = 256, 128 experts of intermediate size 64, top-2; float32), saved with
``save_pretrained`` to a temporary directory (transformers writes its experts one tensor per expert).

Each run is a child process that imports torch, transformers and expertcache, reads its own data
segment size after a warm-up on a tiny model (so lazy imports and first-use buffers come first;
``VmData``: private writable memory, the heap and anonymous mappings; a read-only file mapping is not
part of it) and sets ``RLIMIT_DATA`` to that plus ``--limit-mb``, smaller than
the model's expert bytes. It then loads the model and executes the prompts with the executor
(``rho`` 1/16, B = 1, fused, lru, ``--new-tokens`` decode forwards):

* ``mmap, limited``: :func:`expertcache.execute.checkpoint.load_offloaded` + the executor — must run;
* ``ram, limited``: ``from_pretrained`` + the executor's RAM host tier — must fail (the limit bites);
* ``ram, unlimited``: the same without a limit — the tokens and per-layer transfers of the mmap run
  must equal it.

Printed per run: whether it ran, the process's peak RSS (``VmHWM``: includes pages of the mapped file
the run touched, which are reclaimable page cache), its anonymous RSS at the end (``RssAnon``: what
the kernel cannot drop), and the executor's device/host tier bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

PROMPTS = [[7, 11, 13, 17], [19, 23, 29], [31, 37, 41, 43, 47]]


def save_model(path: Path, layers: int, seed: int = 0) -> int:
    """Save the wide model to ``path``; returns its expert bytes."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = AutoConfig.for_model("qwen3_moe", vocab_size=256, hidden_size=256, intermediate_size=256,
                               moe_intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=64, num_experts=128, num_experts_per_tok=2,
                               max_position_embeddings=256, tie_word_embeddings=False, eos_token_id=1,
                               pad_token_id=0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.5)            # decisive routers, as in expertcache.execute.tiny
    model.save_pretrained(path)
    return int(sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n))


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            k, _, v = line.partition(":")
            if k in ("VmData", "VmHWM", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) * 1024
    return out


def child(model_dir: str, host_tier: str, limit_mb: float | None, new_tokens: int) -> dict:
    """One run (in a fresh process): load, execute, report."""
    # warm-up: a tiny model through both loaders and the executor, so every lazy import (and the BLAS
    # buffers a first matmul allocates) happens before the limit is set
    import tempfile as _tf

    import torch  # noqa: F401  (imported before the limit is set: the footprint the limit adds to)
    import transformers  # noqa: F401

    from expertcache.collect import CollectConfig
    from expertcache.collect.runner import load_weights
    from expertcache.execute import ExecuteConfig
    from expertcache.execute.checkpoint import load_offloaded
    from expertcache.execute.runner import Executor
    from expertcache.execute.tiny import save_model_dir

    with _tf.TemporaryDirectory() as tmp:
        warm = save_model_dir("qwen3_moe", Path(tmp) / "warm")
        for m, h in ((load_weights(str(warm), CollectConfig()), None), load_offloaded(warm)):
            Executor(m, ExecuteConfig(batch=1, max_new_tokens=1), eos_token_ids=[], host=h).run([[7, 8]], ["w"])
        del m, h
    base = _status()
    if limit_mb is not None:
        limit = base["VmData"] + int(limit_mb * 2**20)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    cfg = ExecuteConfig(policy="lru", rho=1 / 16, batch=1, max_new_tokens=new_tokens, host_tier=host_tier)
    t0 = time.perf_counter()
    try:
        if host_tier == "mmap":
            model, host = load_offloaded(model_dir)
        else:
            model, host = load_weights(model_dir, CollectConfig()), None
        res = Executor(model, cfg, eos_token_ids=[], host=host).run(PROMPTS, [f"r{i}" for i in range(len(PROMPTS))])
    except (MemoryError, RuntimeError) as e:
        return {"host_tier": host_tier, "limit_mb": limit_mb, "ran": False,
                "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}", **_status()}
    return {"host_tier": host_tier, "limit_mb": limit_mb, "ran": True, "seconds": time.perf_counter() - t0,
            "generated": res.generated, "per_layer": [x.transferred for x in res.per_layer],
            "transfers_copied": res.transfers_copied, "vmdata_after_imports": base["VmData"],
            "device_expert_bytes": res.memory["device_expert_bytes"],
            "device_non_expert_bytes": res.memory["device_non_expert_bytes"],
            "host_expert_bytes": res.memory["host_expert_bytes"], **_status()}


def run_child(model_dir: Path, host_tier: str, limit_mb: float | None, new_tokens: int) -> dict:
    cmd = [sys.executable, __file__, "--child", str(model_dir), "--host-tier", host_tier,
           "--new-tokens", str(new_tokens)] + (["--limit-mb", str(limit_mb)] if limit_mb is not None else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2",
           "TRANSFORMERS_VERBOSITY": "error"}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if not lines:     # killed or crashed before reporting: the limit bit outside Python's allocator
        return {"host_tier": host_tier, "limit_mb": limit_mb, "ran": False,
                "error": f"exit {p.returncode}: {p.stderr.strip().splitlines()[-1:] if p.stderr.strip() else ''}"}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--limit-mb", type=float, default=96.0, help="RLIMIT_DATA above the footprint after imports")
    ap.add_argument("--new-tokens", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--host-tier", default="mmap", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.host_tier, a.limit_mb if "--limit-mb" in sys.argv else None,
                               a.new_tokens)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "wide"
        expert_bytes = save_model(d, a.layers)
        file_bytes = sum(f.stat().st_size for f in d.glob("*.safetensors"))
        runs = [run_child(d, "mmap", a.limit_mb, a.new_tokens), run_child(d, "ram", a.limit_mb, a.new_tokens),
                run_child(d, "ram", None, a.new_tokens)]
    mm, ram_lim, ram = runs
    same = mm.get("ran") and ram.get("ran") and mm["generated"] == ram["generated"] \
        and mm["per_layer"] == ram["per_layer"]
    report = {"expert_bytes": expert_bytes, "file_bytes": file_bytes, "limit_mb": a.limit_mb, "runs": runs,
              "mmap_equals_ram": bool(same)}
    if a.json:
        print(json.dumps(report))
    else:
        print(f"model: {a.layers} layers x 128 experts, expert weights {expert_bytes / 2**20:.0f} MiB "
              f"(file {file_bytes / 2**20:.0f} MiB); each run may allocate {a.limit_mb:.0f} MiB of data beyond "
              "its footprint after imports (RLIMIT_DATA)")
        for r in runs:
            lim = f"limit +{r['limit_mb']:.0f} MiB" if r["limit_mb"] is not None else "no limit"
            if not r["ran"]:
                print(f"  {r['host_tier']:4s} {lim:16s}: did not run ({r['error']})")
                continue
            print(f"  {r['host_tier']:4s} {lim:16s}: ran in {r['seconds']:.1f} s, transferred {sum(r['per_layer'])}; "
                  f"peak RSS {r['VmHWM'] / 2**20:.0f} MiB, anonymous {r['RssAnon'] / 2**20:.0f} MiB, "
                  f"file-backed {r['RssFile'] / 2**20:.0f} MiB; device tier {r['device_expert_bytes'] / 2**20:.1f} "
                  f"MiB of slots + {r['device_non_expert_bytes'] / 2**20:.1f} MiB non-expert, host tier "
                  f"{r['host_expert_bytes'] / 2**20:.0f} MiB")
        print(f"mmap run: tokens and per-layer transfers {'equal' if same else 'DIFFERENT from'} the full-load run")
    ok = bool(mm.get("ran")) and not ram_lim.get("ran") and same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
