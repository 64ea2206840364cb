"""Overhead of ``expertcache execute`` against plain ``generate``, and time per decode step at two capacities.

    python benchmarks/bench_execute.py --threads 1 --repeats 7 --new-tokens 32

Model: a random-init transformers ``Qwen3MoeForCausalLM`` (4 layers, d = 256, 32 experts, top-4, the
shape of benchmarks/bench_collect_overhead.py), 8 prompts of 21-107 tokens, B = 8, greedy, no EOS
(every request runs ``--new-tokens`` decode forwards, so the batch never changes after admission).

Pairs, alternated pair by pair (A, B, A, B, ...; the order inside a pair flips every repeat), wall time
of the whole prompt set, min and median of the per-pair ratio B / A:

1. ``generate``  vs  executor with every expert resident (c = N, offloaded tier, counted, timed);
2. executor loop on the unmodified model (no tiers)  vs  the same with c = N: the cost of the tiers
   and the controller alone, separated from the continuous-batching loop (prefill one request at a
   time, batch KV cache rebuilt on admission);
3. time per decode step (median over steps, from the executor's own timings) at c = N and at two
   smaller capacities (rho 0.5 and 0.25), with the share of it spent copying experts.

Tokens are checked equal across all sides. CPU only here; on CUDA pass ``--device cuda``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def make_model(seed: int = 0):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = AutoConfig.for_model("qwen3_moe", vocab_size=512, hidden_size=256, intermediate_size=512,
                               moe_intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=64, num_experts=32, num_experts_per_tok=4,
                               max_position_embeddings=1024, eos_token_id=511, pad_token_id=0,
                               bos_token_id=1, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():   # never emit EOS: every request decodes exactly --new-tokens tokens
        model.lm_head.weight[511].fill_(0.0)
        model.lm_head.weight[511, 0] = -1e4
    return model


def prompts(n: int = 8) -> list[list[int]]:
    lengths = [21 + (86 * i) // (n - 1) for i in range(n)]
    return [[2 + (i * 37 + j * 11) % 500 for j in range(m)] for i, m in enumerate(lengths)]


def run_generate(model, ps, new_tokens):
    import torch
    from transformers import GenerationConfig

    B, T0 = len(ps), max(len(p) for p in ps)
    ids = torch.zeros((B, T0), dtype=torch.long)
    att = torch.zeros((B, T0), dtype=torch.long)
    for b, p in enumerate(ps):
        ids[b, T0 - len(p):] = torch.tensor(p)
        att[b, T0 - len(p):] = 1
    gen = GenerationConfig(max_new_tokens=new_tokens + 1, do_sample=False, num_beams=1, eos_token_id=None,
                           pad_token_id=0)
    model.generation_config = GenerationConfig(pad_token_id=0)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=att, generation_config=gen)
    dt = time.perf_counter() - t0
    return dt, [out[b, T0:].tolist() for b in range(B)]


def run_executor(model, ps, new_tokens, offload, rho=1.0, device="cpu"):
    from expertcache.execute.config import ExecuteConfig
    from expertcache.execute.runner import Executor

    cfg = ExecuteConfig(policy="lru", rho=rho, batch=len(ps), max_new_tokens=new_tokens, device=device,
                        experts_implementation=None)
    ex = Executor(model, cfg, eos_token_ids=[], offload=offload)
    t0 = time.perf_counter()
    try:
        res = ex.run(ps, [f"r{i}" for i in range(len(ps))])
    finally:
        if offload:
            ex.restore()
    return time.perf_counter() - t0, res


def pairs(fa, fb, repeats):
    ratios, ta, tb = [], [], []
    for i in range(repeats):
        if i % 2 == 0:
            a, b = fa(), fb()
        else:
            b, a = fb(), fa()
        ta.append(a)
        tb.append(b)
        ratios.append(b / a)
    return ratios, ta, tb


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    model = make_model()
    model.to(args.device)
    ps = prompts()
    # the executor runs the model's own experts kernel (grouped_mm by default), like generate
    _, toks_gen = run_generate(model, ps, args.new_tokens)
    _, ref = run_executor(model, ps, args.new_tokens, offload=False, device=args.device)
    checks = {"generate = executor reference": [t[:args.new_tokens + 1] for t in toks_gen] == ref.generated}
    res_by_rho = {}
    for rho in (1.0, 0.5, 0.25):
        _, res_by_rho[rho] = run_executor(model, ps, args.new_tokens, offload=True, rho=rho, device=args.device)
        checks[f"executor rho={rho} = reference"] = res_by_rho[rho].generated == ref.generated
    print(f"tokens equal: {checks}")
    if not all(checks.values()):
        print("tokens differ; not timing", file=sys.stderr)
        return 1

    def gen():
        return run_generate(model, ps, args.new_tokens)[0]

    def ex_full():
        return run_executor(model, ps, args.new_tokens, offload=True, rho=1.0, device=args.device)[0]

    def ex_ref():
        return run_executor(model, ps, args.new_tokens, offload=False, device=args.device)[0]

    def show(name, ratios, ta, tb):
        print(f"{name}: ratio min {min(ratios):.3f}, median {statistics.median(ratios):.3f} "
              f"(A median {statistics.median(ta):.3f} s, B median {statistics.median(tb):.3f} s, {len(ratios)} pairs)")

    show("executor c=N / generate", *pairs(gen, ex_full, args.repeats))
    show("executor c=N / executor loop, model unmodified", *pairs(ex_ref, ex_full, args.repeats))
    for rho in (1.0, 0.5, 0.25):
        steps = []
        copy_share = []
        for _ in range(max(3, args.repeats // 2)):
            _, res = run_executor(model, ps, args.new_tokens, offload=True, rho=rho, device=args.device)
            s = res.summary()
            steps.append(s["decode_step_ms_median"])
            t = res.timings
            dec = (t["phase"] == 1)
            copy_ns = t["ns"][(t["kind"] == "copy") & dec].sum()
            fwd_ns = t["ns"][(t["kind"] == "forward") & dec].sum()
            copy_share.append(copy_ns / fwd_ns if fwd_ns else 0.0)
        cap = res.memory["capacity_per_partition"]
        print(f"rho={rho}: c={cap[0]}/layer, transferred {res.transferred} ({s['decode_misses']} in decode), "
              f"decode step median {statistics.median(steps):.2f} ms (min over runs {min(steps):.2f}), "
              f"copies {statistics.median(copy_share):.1%} of decode forward time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
