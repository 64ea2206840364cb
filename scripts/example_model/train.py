"""Step 3: train the example Qwen3-MoE causal LM on CPU, reproducibly.

The model is transformers' own ``Qwen3MoeForCausalLM`` (no vendored modeling
code), small enough to train in about 20 minutes on one CPU thread. The loss is
the causal-LM cross-entropy plus ``router_aux_loss_coef`` times the
Switch-Transformer load-balancing loss (transformers computes it when
``output_router_logits=True``), so routing does not collapse onto a few
experts. Everything is seeded; with the same Python build (same corpus), the
same torch version and the same thread count the weights are bit-identical.

The training log (``train_log.jsonl``) and a summary (``training.json``: loss
at start and end, held-out loss before and after, configuration, corpus hash)
are saved beside the weights.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class TrainConfig:
    """Model shape and optimisation settings (defaults: the shipped example model)."""

    n_layers: int = 4
    hidden_size: int = 128
    n_heads: int = 4
    n_kv_heads: int = 2
    n_experts: int = 32
    top_k: int = 4
    moe_intermediate_size: int = 64
    aux_loss_coef: float = 0.01
    seq_len: int = 256
    batch_size: int = 16
    steps: int = 800
    lr: float = 3e-3
    warmup: int = 30
    weight_decay: float = 0.1
    holdout_fraction: float = 0.04
    seed: int = 0
    threads: int = 1
    log_every: int = 10


QUICK = TrainConfig(n_layers=2, hidden_size=64, n_experts=8, top_k=2, moe_intermediate_size=32, seq_len=128,
                    batch_size=8, steps=30, warmup=5, log_every=5)


def _token_stream(corpus: Path, tokenizer) -> list[int]:
    from tokenizer import iter_texts  # sibling module (scripts/example_model is on sys.path)

    ids: list[int] = []
    texts = list(iter_texts(corpus))
    for start in range(0, len(texts), 256):
        for row in tokenizer(texts[start:start + 256], add_special_tokens=False)["input_ids"]:
            ids.extend(row)
    return ids


def build_model(cfg: TrainConfig, tokenizer):
    """A freshly initialised ``Qwen3MoeForCausalLM`` of the configured shape (seeded by the caller)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=4 * cfg.hidden_size,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.hidden_size // cfg.n_heads, max_position_embeddings=4096,
        moe_intermediate_size=cfg.moe_intermediate_size, num_experts=cfg.n_experts,
        num_experts_per_tok=cfg.top_k, norm_topk_prob=True, router_aux_loss_coef=cfg.aux_loss_coef,
        decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen3MoeForCausalLM(config)


def train(corpus: Path, tokenizer_dir: Path, out_dir: Path, cfg: TrainConfig, corpus_sha256: str = "",
          progress: bool = True) -> dict:
    """Train and ``save_pretrained`` (safetensors) the model and tokenizer into ``out_dir``; return the summary."""
    import portable  # sibling module (scripts/example_model is on sys.path)
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    portable.check()
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = torch.tensor(_token_stream(corpus, tokenizer), dtype=torch.long)
    n_blocks = ids.numel() // (cfg.seq_len + 1)
    blocks = ids[: n_blocks * (cfg.seq_len + 1)].view(n_blocks, cfg.seq_len + 1)
    gen = torch.Generator().manual_seed(cfg.seed)
    perm = torch.randperm(n_blocks, generator=gen)
    n_hold = max(1, int(n_blocks * cfg.holdout_fraction))
    holdout, train_blocks = blocks[perm[:n_hold]], blocks[perm[n_hold:]]

    model = build_model(cfg, tokenizer)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "norm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    @torch.no_grad()
    def heldout_loss() -> float:
        model.eval()
        tot = 0.0
        for i in range(0, holdout.shape[0], cfg.batch_size):
            b = holdout[i:i + cfg.batch_size]
            tot += float(model(input_ids=b[:, :-1], labels=b[:, :-1]).loss) * b.shape[0]
        model.train()
        return tot / holdout.shape[0]

    out_dir.mkdir(parents=True, exist_ok=True)
    log = []
    held_before = heldout_loss()
    order = torch.empty(0, dtype=torch.long)
    cursor = 0
    t0 = time.time()
    for step in range(cfg.steps):
        if cursor + cfg.batch_size > order.numel():  # a new epoch: reshuffle from the seeded generator
            order = torch.randperm(train_blocks.shape[0], generator=gen)
            cursor = 0
        batch = train_blocks[order[cursor:cursor + cfg.batch_size]]
        cursor += cfg.batch_size
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        out = model(input_ids=batch[:, :-1], labels=batch[:, :-1], output_router_logits=True)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            aux = float(out.aux_loss.detach())
            rec = {"step": step, "loss": float(out.loss.detach()) - cfg.aux_loss_coef * aux, "aux_loss": aux,
                   "lr": lr_at(step), "elapsed_s": round(time.time() - t0, 1)}
            log.append(rec)
            if progress:
                print(json.dumps(rec), flush=True)
    held_after = heldout_loss()

    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=False)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    with open(out_dir / "train_log.jsonl", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in log)
    summary = {
        "config": asdict(cfg), "corpus_sha256": corpus_sha256, "n_train_tokens": int(train_blocks.numel()),
        "n_heldout_tokens": int(holdout.numel()), "tokens_seen": cfg.steps * cfg.batch_size * cfg.seq_len,
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "first_logged_loss": log[0]["loss"], "last_logged_loss": log[-1]["loss"],
        "heldout_loss_before": held_before, "heldout_loss_after": held_after,
        "final_aux_loss": log[-1]["aux_loss"], "train_seconds": round(time.time() - t0, 1),
        "torch": torch.__version__, "kernels": dict(portable.PORTABLE_ENV),
    }
    (out_dir / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
