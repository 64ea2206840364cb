"""Collection overhead: routed tokens/s of ``expertcache collect``'s recording vs plain ``generate``.

    python benchmarks/bench_collect_overhead.py [--layers 4] [--hidden 256] [--experts 32] [--top-k 4]
                                                [--batch 8] [--new-tokens 64] [--repeats 5] [--save-hidden]

Builds a random-init Qwen3-MoE causal LM from a config (nothing is downloaded),
then times, on the same left-padded batch of prompts of unequal lengths and
with greedy decoding:

- ``plain``: ``model.generate`` alone;
- ``hooked``: what collect does per batch — ``generate`` with the router hooks,
  then cutting each sequence's routes out and computing probabilities,
  entropy and margin (``runner._run_batch``); writing shards is excluded.

Both produce the same tokens (checked). The two are interleaved ``--repeats``
times after a warm-up and the medians are compared; the overhead is
``plain_tokens_per_s / hooked_tokens_per_s - 1`` (routed tokens = prompt +
decode tokens of every sequence). On a shared or loaded machine use ``--threads 1``
and more repeats; the best-of-repeats ratio is printed too.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

from expertcache.collect import CollectConfig
from expertcache.collect.adapters import adapter_for, find_moe_layers
from expertcache.collect.recorder import RouterRecorder
from expertcache.collect.runner import _run_batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--save-hidden", action="store_true", help="Also record hidden states (fp16).")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default).")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("qwen3_moe", vocab_size=1024, hidden_size=args.hidden,
                               intermediate_size=2 * args.hidden, moe_intermediate_size=args.hidden // 2,
                               num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4,
                               head_dim=args.hidden // 8, num_experts=args.experts,
                               num_experts_per_tok=args.top_k, max_position_embeddings=4096, eos_token_id=None,
                               pad_token_id=0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 1024, (int(n),), generator=g).tolist()
               for n in torch.randint(16, 128, (args.batch,), generator=g)]
    T0 = max(map(len, prompts))
    ids = torch.tensor([[0] * (T0 - len(p)) + p for p in prompts])
    mask = (torch.arange(T0)[None, :] >= (T0 - torch.tensor([len(p) for p in prompts]))[:, None]).long()
    config = CollectConfig(max_new_tokens=args.new_tokens, save_hidden=args.save_hidden)
    gen = GenerationConfig(max_new_tokens=args.new_tokens + 1, do_sample=False, num_beams=1, eos_token_id=None,
                           pad_token_id=0)
    layers = find_moe_layers(model, adapter_for(cfg))
    adapter = adapter_for(cfg)
    n_tokens = sum(len(p) for p in prompts) + args.batch * args.new_tokens

    def plain() -> tuple[float, torch.Tensor]:
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
        return time.perf_counter() - t, out

    def hooked() -> tuple[float, list]:
        with RouterRecorder(layers, save_hidden=args.save_hidden) as rec:   # hooks only during this run
            t = time.perf_counter()
            res = _run_batch(model, rec, adapter, prompts, config, [], 0)
            return time.perf_counter() - t, res

    plain()
    hooked()                       # warm-up
    times_p, times_h = [], []
    for _ in range(args.repeats):  # interleaved, so machine-load drift hits both alike
        tp, out = plain()
        th, res = hooked()
        times_p.append(tp)
        times_h.append(th)
    assert sum(r.experts.shape[0] for r in res) == n_tokens
    for b, r in enumerate(res):    # the recording run emitted exactly the plain run's tokens
        assert r.token_id.tolist() == out[b, T0 - len(prompts[b]):T0 + args.new_tokens].tolist()
    mp, mh = statistics.median(times_p), statistics.median(times_h)
    print(f"model: qwen3_moe L={args.layers} d={args.hidden} N={args.experts} k={args.top_k}; batch {args.batch}, "
          f"prompts {min(map(len, prompts))}-{T0} tokens, {args.new_tokens} decode forwards; "
          f"{n_tokens} routed tokens; torch threads {torch.get_num_threads()}")
    print(f"plain generate : {n_tokens / mp:10.1f} tokens/s (median of {args.repeats})")
    print(f"collect hooks  : {n_tokens / mh:10.1f} tokens/s (median of {args.repeats}; save_hidden={args.save_hidden})")
    print(f"overhead       : {mh / mp - 1:+.1%}  (ratio hooked/plain time {mh / mp:.3f}; "
          f"best-of-{args.repeats} ratio {min(times_h) / min(times_p):.3f})")


if __name__ == "__main__":
    main()
