"""Tiny random-init models of every supported architecture, for the equality matrix, tests and benchmark.

Nothing is downloaded: each model is ``AutoModelForCausalLM.from_config`` of transformers' own class with
a small config (2-3 layers, 8 experts top-2; the Qwen3-MoE one 16 experts top-4), seeded, with decisive
random routers (router weights N(0, 0.5), so no near-ties between the k-th and the next expert). Shapes
follow tests/test_collect.py. Needs torch and transformers.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

__all__ = ["ARCH", "make_model", "prompt_ids", "make_tokenizer", "save_model_dir", "write_prompts"]

import torch

VOCAB = 64
SPECIALS = ["<pad>", "<eos>", "<bos>", "<user>", "<assistant>", "<system>"]
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}<assistant> {% endif %}")
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, num_experts_per_tok=2, pad_token_id=0,
              eos_token_id=1, bos_token_id=2, tie_word_embeddings=False)
ARCH = {
    "qwen3_moe": dict(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=16, head_dim=8,
                      num_hidden_layers=3),
    "olmoe": dict(num_experts=8),
    "mixtral": dict(num_local_experts=8),
    "qwen2_moe": dict(num_experts=8, moe_intermediate_size=16, shared_expert_intermediate_size=24),
    "granitemoe": dict(num_local_experts=8),
    "deepseek_v3": dict(n_routed_experts=8, n_group=4, topk_group=2, first_k_dense_replace=1, moe_intermediate_size=16,
                        n_shared_experts=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4,
                        v_head_dim=8, num_hidden_layers=3, num_key_value_heads=4),
    "gpt_oss": dict(num_local_experts=8, head_dim=8, layer_types=["sliding_attention", "full_attention"],
                    sliding_window=16),
}
ROUTER_CLASS = {
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeTopKRouter"), "olmoe": ("olmoe", "OlmoeTopKRouter"),
    "mixtral": ("mixtral", "MixtralTopKRouter"), "qwen2_moe": ("qwen2_moe", "Qwen2MoeTopKRouter"),
    "granitemoe": ("granitemoe", "GraniteMoeTopKRouter"), "deepseek_v3": ("deepseek_v3", "DeepseekV3TopkRouter"),
    "gpt_oss": ("gpt_oss", "GptOssTopKRouter"),
}
#: prompt lengths of the execute tests: unequal, one long enough that its prefill touches every expert.
PROMPT_LENGTHS = [3, 9, 1, 14, 5, 7]


def make_model(arch: str, seed: int = 0):
    """A tiny random-init model of ``arch`` with decisive routers, in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(arch, **{**COMMON, **ARCH[arch]})
    model = AutoModelForCausalLM.from_config(cfg).eval()
    mod, name = ROUTER_CLASS[arch]
    cls = getattr(importlib.import_module(f"transformers.models.{mod}.modeling_{mod}"), name)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, cls):
                m.weight.normal_(0.0, 0.5)
                if hasattr(m, "e_score_correction_bias"):
                    m.e_score_correction_bias.normal_(0.0, 0.3)
    return model


def prompt_ids(lengths=PROMPT_LENGTHS) -> list[list[int]]:
    """Token ids of the test prompts (no EOS, no pad)."""
    return [[len(SPECIALS) + (i * 7 + j) % 50 for j in range(n)] for i, n in enumerate(lengths)]


def make_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for i in range(VOCAB - len(SPECIALS)):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   chat_template=TEMPLATE)


def save_model_dir(arch: str, path: Path, seed: int = 0) -> Path:
    """A local model directory (weights + tokenizer) of a tiny ``arch`` model."""
    make_model(arch, seed).save_pretrained(path)
    make_tokenizer().save_pretrained(path)
    return path


def write_prompts(path: Path, lengths=PROMPT_LENGTHS) -> Path:
    """A prompts JSONL whose raw text encodes (with :func:`make_tokenizer`, no template) like :func:`prompt_ids`."""
    with open(path, "w") as fh:
        for i, n in enumerate(lengths):
            fh.write(json.dumps({"id": f"r{i}", "prompt": " ".join(f"w{(i * 7 + j) % 50}" for j in range(n))}) + "\n")
    return path
