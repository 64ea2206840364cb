"""expertcache collect on tiny random-init models of every supported architecture (offline).

The recorded routes are checked against an independent forward pass of each
full sequence (prompt + generated tokens) alone through the model, observed by
this file's own hooks on the transformers router classes, and against naive
numpy re-derivations (top-k / grouped selection, probabilities, entropy,
margin, greedy tokens).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from click.testing import CliRunner  # noqa: E402

from expertcache.cli import main  # noqa: E402
from expertcache.collect import CollectConfig, collect, read_array, read_prompts  # noqa: E402
from expertcache.errors import IntegrityError, ValidationError  # noqa: E402
from expertcache.trace import read_trace  # noqa: E402

SPECIALS = ["<pad>", "<eos>", "<bos>", "<user>", "<assistant>", "<system>", "<nothink>"]
VOCAB = 64
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}<assistant> {% endif %}"
            "{% if enable_thinking is defined and not enable_thinking %}<nothink> {% endif %}")
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, num_experts_per_tok=2, pad_token_id=0,
              eos_token_id=1, bos_token_id=2, tie_word_embeddings=False)
ARCH = {
    "qwen3_moe": dict(num_experts=8, moe_intermediate_size=16, head_dim=8),
    "qwen2_moe": dict(num_experts=8, moe_intermediate_size=16, shared_expert_intermediate_size=24),
    "olmoe": dict(num_experts=8),
    "mixtral": dict(num_local_experts=8),
    "granitemoe": dict(num_local_experts=8),
    "gpt_oss": dict(num_local_experts=8, head_dim=8, layer_types=["sliding_attention", "full_attention"],
                    sliding_window=16),
    "deepseek_v3": dict(n_routed_experts=8, n_group=4, topk_group=2, first_k_dense_replace=1, moe_intermediate_size=16,
                        n_shared_experts=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4,
                        v_head_dim=8, num_hidden_layers=3, num_key_value_heads=4),
}
# The test's own knowledge of where each router class lives (not the package's adapter table).
ROUTER_CLASS = {
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeTopKRouter"),
    "qwen2_moe": ("qwen2_moe", "Qwen2MoeTopKRouter"),
    "olmoe": ("olmoe", "OlmoeTopKRouter"),
    "mixtral": ("mixtral", "MixtralTopKRouter"),
    "granitemoe": ("granitemoe", "GraniteMoeTopKRouter"),
    "gpt_oss": ("gpt_oss", "GptOssTopKRouter"),
    "deepseek_v3": ("deepseek_v3", "DeepseekV3TopkRouter"),
}
PROMPT_LENGTHS = [3, 9, 1, 12, 5]


def router_class(arch: str) -> type:
    mod, name = ROUTER_CLASS[arch]
    return getattr(importlib.import_module(f"transformers.models.{mod}.modeling_{mod}"), name)


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


def make_model(arch: str, seed: int = 0, **over):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(arch, **{**COMMON, **ARCH.get(arch, {}), **over})
    model = AutoModelForCausalLM.from_config(cfg).eval()
    cls = router_class(arch) if arch in ROUTER_CLASS else None
    with torch.no_grad():
        for mod in model.modules():
            if cls is not None and isinstance(mod, cls):
                mod.weight.normal_(0.0, 0.5)   # decisive routing: no near-ties between top-k and the rest
                if hasattr(mod, "e_score_correction_bias"):
                    mod.e_score_correction_bias.normal_(0.0, 0.3)
    return model


def write_prompts(path: Path, lengths=PROMPT_LENGTHS, messages_row: bool = True) -> Path:
    with open(path, "w") as fh:
        for i, n in enumerate(lengths):
            text = " ".join(f"w{(i * 7 + j) % 50}" for j in range(n))
            row: dict = {"id": f"r{i}", "prompt": text, "category": "math" if i % 2 else "code"}
            if messages_row and i == 1:
                row = {"id": "r1", "messages": [{"role": "system", "content": "w1 w2"},
                                                {"role": "user", "content": text}], "category": "math"}
            fh.write(json.dumps(row) + "\n")
    return path


def encode_independently(tok, row: dict) -> list[int]:
    messages = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
    text = "".join(f"<{m['role']}> {m['content']} " for m in messages) + "<assistant> <nothink> "
    return tok(text, add_special_tokens=False)["input_ids"]


def reference(model, arch: str, ids: list[int]) -> dict[str, np.ndarray]:
    """Run one sequence alone (no padding, no cache) and observe every router with our own hooks."""
    cls = router_class(arch)
    routers = [m for m in model.modules() if isinstance(m, cls)]
    seen: list = []

    def hook(mod, args, out):
        x = args[0]
        seen.append((x.reshape(-1, x.shape[-1]).float().numpy().copy(),
                     [o.detach().float().numpy().copy() for o in out]))

    handles = [r.register_forward_hook(hook) for r in routers]
    try:
        with torch.no_grad():
            lm = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
    finally:
        for h in handles:
            h.remove()
    assert len(seen) == len(routers)
    return {"hidden": np.stack([s[0] for s in seen], 1), "logits": np.stack([s[1][0] for s in seen], 1),
            "gates": np.stack([s[1][1] for s in seen], 1), "experts": np.stack([s[1][2] for s in seen], 1).astype(int),
            "lm": lm, "routers": routers}


def naive_probs(logits: np.ndarray, arch: str) -> np.ndarray:
    x = logits.astype(np.float64)
    if arch == "deepseek_v3":
        s = 1.0 / (1.0 + np.exp(-x))
        return s / s.sum(-1, keepdims=True)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def naive_selection(logits: np.ndarray, arch: str, router, k: int) -> np.ndarray:
    """Sorted expert ids chosen from the logits by each architecture's documented rule."""
    if arch != "deepseek_v3":
        return np.sort(np.argsort(-logits, axis=-1, kind="stable")[..., :k], axis=-1)
    bias = router.e_score_correction_bias.numpy().astype(np.float64)
    G, tg = router.num_group, router.topk_group
    s = 1.0 / (1.0 + np.exp(-logits.astype(np.float64))) + bias
    n, N = s.shape
    grp = np.sort(s.reshape(n, G, N // G), axis=-1)[..., -2:].sum(-1)
    keep = np.argsort(-grp, axis=-1)[:, :tg]
    mask = np.zeros((n, G), bool)
    np.put_along_axis(mask, keep, True, axis=1)
    s = np.where(np.repeat(mask, N // G, axis=1), s, -np.inf)
    return np.sort(np.argsort(-s, axis=-1)[:, :k], axis=-1)


def check_against_reference(model, arch: str, trace_dir: Path, prompts: Path, tok, max_new: int,
                            arrays: bool) -> dict[str, int]:
    tr = read_trace(trace_dir)
    rows = [json.loads(x) for x in prompts.read_text().splitlines()]
    eos = set(np.atleast_1d(model.generation_config.eos_token_id).tolist())
    k = tr.top_k
    hidden = read_array(trace_dir, "hidden") if arrays else None
    logits = read_array(trace_dir, "logits") if arrays else None
    stops = {"eos": 0, "length": 0}
    assert tr.request_ids == tuple(r["id"] for r in rows)
    assert tr.provenance["categories"] == {r["id"]: r["category"] for r in rows}
    for ri, row in enumerate(rows):
        R = np.flatnonzero(tr.request == ri)
        prompt = encode_independently(tok, row)
        P = len(prompt)
        ids = tr.token_id[R].tolist()
        D = len(R) - P
        assert ids[:P] == prompt
        assert (tr.position[R] == np.arange(len(R))).all()
        assert (tr.phase[R] == np.r_[np.zeros(P), np.ones(D)]).all()
        ref = reference(model, arch, ids)
        assert ref["experts"].shape[1] == tr.n_layers
        # the recorded selection is the model's own, at every position and layer
        np.testing.assert_array_equal(np.sort(tr.experts[R], -1), np.sort(ref["experts"], -1))
        order_t, order_r = np.argsort(tr.experts[R], -1), np.argsort(ref["experts"], -1)
        np.testing.assert_allclose(np.take_along_axis(tr.gates[R], order_t, -1),
                                   np.take_along_axis(ref["gates"], order_r, -1), atol=1e-4)
        # ... and equals each architecture's rule applied to the logits (naive twin)
        for li in range(tr.n_layers):
            router = ref["routers"][li]
            np.testing.assert_array_equal(np.sort(tr.experts[R, li], -1),
                                          naive_selection(ref["logits"][:, li], arch, router, k))
        p = naive_probs(ref["logits"], arch)
        np.testing.assert_allclose(tr.probs[R], np.take_along_axis(p, tr.experts[R].astype(int), -1), atol=1e-5)
        np.testing.assert_allclose(tr.entropy[R], -(p * np.log(p)).sum(-1), atol=1e-4)
        ps = np.sort(p, -1)
        np.testing.assert_allclose(tr.margin[R], ps[..., -1] - ps[..., -2], atol=1e-5)
        # greedy decoding, decode positions aligned: token at P+j is the argmax after position P+j-1
        greedy = ref["lm"].argmax(-1)
        assert ids[P:] == greedy[P - 1:len(ids) - 1].tolist()
        meta = tr.provenance["requests"][row["id"]]
        assert meta["prompt_tokens"] == P and meta["decode_tokens"] == D
        if meta["stop"] == "length":
            assert D == max_new
        else:
            assert int(greedy[-1]) in eos and D <= max_new
        stops[meta["stop"]] += 1
        assert not (set(ids[P:]) & eos)
        if arrays:
            np.testing.assert_allclose(logits[R].astype(np.float32), ref["logits"], atol=2e-2, rtol=1e-2)
            np.testing.assert_allclose(hidden[R].astype(np.float32), ref["hidden"], atol=2e-2, rtol=1e-2)
    return stops


@pytest.mark.parametrize("arch", list(ARCH))
def test_collect_records_the_models_own_selection(arch, tmp_path):
    model, tok = make_model(arch), make_tokenizer()
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    # Declare as EOS a token that r0 generates but another request does not, so one row finishes early
    # inside a running batch while others run to the length cap.
    encoded = [encode_independently(tok, {"prompt": r.prompt, "messages": r.messages}) for r in read_prompts(prompts)]
    T = max(map(len, encoded))
    batch = torch.tensor([[0] * (T - len(e)) + e for e in encoded])
    with torch.no_grad():
        out = model.generate(input_ids=batch, attention_mask=(batch != 0).long(), max_new_tokens=7,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    gens = out[:, T:].tolist()
    eos = next(t for t in gens[0] if any(t not in g for g in gens[1:]))
    model.generation_config.eos_token_id = eos
    # sampling-free processors in the model's generation config must not leak into the greedy collection
    model.generation_config.repetition_penalty = 4.0
    model.generation_config.no_repeat_ngram_size = 1
    max_new = 6
    cfg = CollectConfig(max_new_tokens=max_new, batch_size=3, shard_size=4, save_hidden=True, save_logits=True)
    res = collect(model, prompts, tmp_path / "trace", cfg, tokenizer=tok, model_id=f"tiny-{arch}")
    assert res.n_shards == 2 and res.n_shards_skipped == 0
    stops = check_against_reference(model, arch, tmp_path / "trace", prompts, tok, max_new, arrays=True)
    assert stops["eos"] >= 1 and stops["length"] >= 1, stops
    tr = read_trace(tmp_path / "trace")
    prov = tr.provenance
    n_moe = ARCH[arch].get("num_hidden_layers", 2) - ARCH[arch].get("first_k_dense_replace", 0)
    assert tr.n_layers == n_moe and tr.n_experts == 8 and tr.top_k == 2
    assert prov["model_type"] == arch and prov["enable_thinking"] is False and prov["chat_template"] is True
    experts = next(m for m in model.modules() if type(m).__name__.endswith("Experts"))
    assert prov["expert_block_bytes"] == sum(p.numel() * 4 for p in experts.parameters()) // 8
    if arch == "deepseek_v3":
        assert prov["moe_layers"] == [1, 2]
        # bias + group selection differs from a plain top-k of the logits somewhere: the hook records the former
        plain = np.sort(np.argsort(-read_array(tmp_path / "trace", "logits").astype(np.float32), -1)[..., :2], -1)
        assert (plain != np.sort(tr.experts, -1)).any()


def test_padding_side_does_not_matter(tmp_path):
    model, tok = make_model("qwen3_moe", seed=3), make_tokenizer()
    prompts = write_prompts(tmp_path / "p.jsonl")
    cfg = CollectConfig(max_new_tokens=4, batch_size=5, shard_size=5)
    tok.padding_side = "right"
    collect(model, prompts, tmp_path / "right", cfg, tokenizer=tok, model_id="m")
    tok.padding_side = "left"
    collect(model, prompts, tmp_path / "left", cfg, tokenizer=tok, model_id="m")
    a, b = read_trace(tmp_path / "right"), read_trace(tmp_path / "left")
    np.testing.assert_array_equal(a.experts, b.experts)
    np.testing.assert_array_equal(a.token_id, b.token_id)
    # batch 1 (no padding at all) gives the same selections and tokens
    collect(model, prompts, tmp_path / "solo", CollectConfig(max_new_tokens=4, batch_size=1, shard_size=5),
            tokenizer=tok, model_id="m")
    c = read_trace(tmp_path / "solo")
    np.testing.assert_array_equal(np.sort(a.experts, -1), np.sort(c.experts, -1))
    np.testing.assert_array_equal(a.token_id, c.token_id)


def test_prompt_cap_and_raw_prompts(tmp_path):
    model, tok = make_model("mixtral", seed=1), make_tokenizer()
    prompts = write_prompts(tmp_path / "p.jsonl", messages_row=False)
    cfg = CollectConfig(max_new_tokens=2, max_prompt_tokens=4, chat_template=False, batch_size=2, shard_size=8)
    collect(model, prompts, tmp_path / "t", cfg, tokenizer=tok, model_id="m")
    tr = read_trace(tmp_path / "t")
    for ri, rec in enumerate(read_prompts(prompts)):
        full = tok(rec.prompt)["input_ids"]
        R = np.flatnonzero((tr.request == ri) & (tr.phase == 0))
        assert tr.token_id[R].tolist() == full[-4:]
        assert tr.provenance["requests"][rec.request_id]["prompt_tokens_dropped"] == max(0, len(full) - 4)
    assert tr.provenance["chat_template"] is False and tr.provenance["enable_thinking"] is None
    with pytest.raises(ValidationError, match="no chat template"):
        collect(model, write_prompts(tmp_path / "m.jsonl"), tmp_path / "t2", cfg, tokenizer=tok, model_id="m")
    assert not (tmp_path / "t2").exists()


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_kill_and_resume_is_byte_identical(tmp_path):
    model, tok = make_model("olmoe", seed=2), make_tokenizer()
    prompts = write_prompts(tmp_path / "p.jsonl")
    cfg = CollectConfig(max_new_tokens=3, batch_size=2, shard_size=2, save_hidden=True)
    whole = collect(model, prompts, tmp_path / "whole", cfg, tokenizer=tok, model_id="m")
    assert whole.n_shards == 3

    class Killed(Exception):
        pass

    def kill_at_shard_2(ev):
        if ev.shard == 2 and not ev.skipped:
            raise Killed

    with pytest.raises(Killed):
        collect(model, prompts, tmp_path / "cut", cfg, tokenizer=tok, model_id="m", progress=kill_at_shard_2)
    cut = tmp_path / "cut"
    assert sorted(p.name for p in (cut / "shards").iterdir()) == ["00000", "00001"]
    assert not (cut / "manifest.json").exists()
    with pytest.raises(ValidationError):
        read_trace(cut)
    # a write killed halfway leaves a hidden temporary directory behind
    (cut / "shards" / ".00002.dead.tmp").mkdir()
    (cut / "shards" / ".00002.dead.tmp" / "routes.parquet").write_bytes(b"half")
    events = []
    resumed = collect(model, prompts, cut, cfg, tokenizer=tok, model_id="m", progress=events.append)
    assert resumed.n_shards_skipped == 2 and [e.shard for e in events if e.skipped] == [0, 1]
    assert tree_bytes(cut) == tree_bytes(tmp_path / "whole")
    # a finished collection is left alone
    again = collect(model, prompts, cut, cfg, tokenizer=tok, model_id="m")
    assert again.already_complete and tree_bytes(cut) == tree_bytes(tmp_path / "whole")
    assert read_array(cut, "hidden").shape == (read_trace(cut).n_tokens, 2, 32)
    with pytest.raises(ValidationError, match="--save-logits"):
        read_array(cut, "logits")
    with pytest.raises(ValidationError, match="expected one of"):
        read_array(cut, "gates")
    # tampering is detected: by the reader, and by a resume that would build on a modified shard
    hidden = cut / "shards" / "00001" / "hidden.npy"
    data = bytearray(hidden.read_bytes())
    data[-1] ^= 1
    hidden.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="sha256"):
        read_array(cut, "hidden")
    (cut / "manifest.json").unlink()
    with pytest.raises(IntegrityError, match="shard file missing or modified"):
        collect(model, prompts, cut, cfg, tokenizer=tok, model_id="m")


_KILL_SCRIPT = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from test_collect import make_model, make_tokenizer
from expertcache.collect import CollectConfig, collect
model, tok = make_model("qwen2_moe", seed=5), make_tokenizer()
def kill(ev):
    if ev.shard == 1 and not ev.skipped:
        os.kill(os.getpid(), signal.SIGKILL)
collect(model, {prompts!r}, {out!r}, CollectConfig(max_new_tokens=3, batch_size=1, shard_size=2), tokenizer=tok,
        model_id="m", progress=kill if {kill} else None)
"""


@pytest.mark.slow
def test_sigkill_and_resume_is_byte_identical(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl")
    tests = str(Path(__file__).parent)
    for out, kill in (("cut", True), ("cut", False), ("whole", False)):
        script = _KILL_SCRIPT.format(tests=tests, prompts=str(prompts), out=str(tmp_path / out), kill=kill)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        if kill:
            assert proc.returncode == -9, proc.stderr[-2000:]
            # finished shard 0, plus (now that batches stream into it) shard 1's hidden temporary directory
            left = sorted(p.name for p in (tmp_path / out / "shards").iterdir())
            assert [n for n in left if not n.startswith(".")] == ["00000"]
            assert all(n.startswith(".00001.") and n.endswith(".tmp") for n in left if n.startswith("."))
        else:
            assert proc.returncode == 0, proc.stderr[-2000:]
    assert tree_bytes(tmp_path / "cut") == tree_bytes(tmp_path / "whole")


# ---------------------------------------------------------------- bad input


def test_unknown_architecture_and_no_moe_layers(tmp_path):
    tok = make_tokenizer()
    prompts = write_prompts(tmp_path / "p.jsonl")
    llama = make_model("llama")
    llama.save_pretrained(tmp_path / "llama")
    tok.save_pretrained(tmp_path / "llama")
    res = CliRunner().invoke(main, ["collect", str(tmp_path / "llama"), "--prompts", str(prompts),
                                    "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and "unsupported architecture model_type='llama'" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "out").exists()
    dense = make_model("qwen3_moe", mlp_only_layers=[0, 1])
    with pytest.raises(ValidationError, match="no MoE layers"):
        collect(dense, prompts, tmp_path / "out", CollectConfig(max_new_tokens=1), tokenizer=tok, model_id="d")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("line, match", [
    ("not json", "not valid JSON"),
    ('{"id": "a"}', "exactly one of 'prompt'"),
    ('{"prompt": "w1", "messages": [{"role": "user", "content": "w1"}]}', "exactly one of 'prompt'"),
    ('{"prompt": 3}', "field 'prompt'"),
    ('{"prompt": "   "}', "field 'prompt'"),
    ('{"messages": [{"role": "user"}]}', "field 'messages'"),
    ('{"messages": []}', "field 'messages'"),
    ('{"prompt": "w1", "id": 7}', "field 'id'"),
    ('{"prompt": "w1", "id": "r0"}', "duplicate id 'r0'"),
    ('{"prompt": "w1", "category": ""}', "field 'category'"),
    ('{"prompt": "w1", "temperature": 0.7}', "unknown field 'temperature'"),
])
def test_bad_prompt_rows_name_the_line(tmp_path, line, match):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "r0", "prompt": "w1 w2"}\n\n' + line + "\n")
    with pytest.raises(ValidationError, match=match) as err:
        read_prompts(path)
    assert "record 3" in str(err.value)


def test_bad_prompts_via_cli_write_nothing(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "w1"}\n{"text": "w2"}\n')
    res = CliRunner().invoke(main, ["collect", "no-such-model", "--prompts", str(path), "-o", str(tmp_path / "o")])
    assert res.exit_code == 2 and "record 2" in res.output and "unknown field 'text'" in res.output
    assert not (tmp_path / "o").exists()
    path.write_text("")
    res = CliRunner().invoke(main, ["collect", "no-such-model", "--prompts", str(path), "-o", str(tmp_path / "o")])
    assert res.exit_code == 2 and "no prompts" in res.output


def test_output_holding_another_collection_is_refused_untouched(tmp_path):
    model, tok = make_model("granitemoe", seed=4), make_tokenizer()
    prompts = write_prompts(tmp_path / "p.jsonl")
    cfg = CollectConfig(max_new_tokens=2, batch_size=5, shard_size=5)
    out = tmp_path / "t"
    collect(model, prompts, out, cfg, tokenizer=tok, model_id="m")
    before = tree_bytes(out)
    other_prompts = write_prompts(tmp_path / "q.jsonl", lengths=[2, 2])
    cases = [
        (dict(config=CollectConfig(max_new_tokens=3, batch_size=5, shard_size=5)), "params.max_new_tokens"),
        (dict(prompts=other_prompts), "prompts_sha256"),
        (dict(model=make_model("granitemoe", seed=9)), "router_sha256"),
        (dict(model_id="other"), "model"),
    ]
    for change, field in cases:
        kw = {"model": model, "prompts": prompts, "config": cfg, "model_id": "m", **change}
        with pytest.raises(ValidationError, match="different collection") as err:
            collect(kw["model"], kw["prompts"], out, kw["config"], tokenizer=tok, model_id=kw["model_id"])
        assert field in str(err.value)
        assert tree_bytes(out) == before
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ValidationError, match="not empty"):
        collect(model, prompts, foreign, cfg, tokenizer=tok, model_id="m")
    assert tree_bytes(foreign) == {"notes.txt": b"mine"}


def test_cli_collects_a_saved_model(tmp_path):
    model, tok = make_model("gpt_oss", seed=6), make_tokenizer()
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    prompts = write_prompts(tmp_path / "p.jsonl")
    args = ["collect", str(tmp_path / "m"), "--prompts", str(prompts), "-o", str(tmp_path / "t"),
            "--max-new-tokens", "3", "--batch-size", "2", "--shard-size", "3", "--save-logits", "--json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout.strip().splitlines()[-1])
    tr = read_trace(tmp_path / "t")
    assert info["n_tokens"] == tr.n_tokens and info["n_shards"] == 2 and not info["already_complete"]
    assert read_array(tmp_path / "t", "logits").shape == (tr.n_tokens, 2, 8)
    assert tr.provenance["model"] == str(tmp_path / "m") and tr.provenance["dtype"] == "float32"
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0 and json.loads(res.stdout.strip().splitlines()[-1])["already_complete"]
    res = CliRunner().invoke(main, args[:-1] + ["--device", "cpu", "--device-map", "auto"])
    assert res.exit_code == 2 and "not both" in res.output


@pytest.mark.slow
def test_save_hidden_streams_batches_to_disk_instead_of_holding_the_shard(tmp_path):
    """Regression: with --save-hidden every hidden state of a shard stayed in RAM (then was copied once more)
    until the shard was written; at Qwen3-30B-A3B scale (192 KiB per token) a 32-prompt shard is ~14 GB.
    Now each batch's rows go to the shard's temporary directory as soon as the batch is done."""
    import tracemalloc

    model, tok = make_model("qwen3_moe", seed=7, hidden_size=1536, num_hidden_layers=4), make_tokenizer()
    model.generation_config.eos_token_id = None
    prompts = write_prompts(tmp_path / "p.jsonl", lengths=[30] * 8, messages_row=False)

    def run(name: str, save_hidden: bool, traced: bool) -> int:
        cfg = CollectConfig(max_new_tokens=4, batch_size=1, shard_size=8, save_hidden=save_hidden)
        if traced:
            tracemalloc.start()
        try:
            collect(model, prompts, tmp_path / name, cfg, tokenizer=tok, model_id="m")
            return tracemalloc.get_traced_memory()[1] if traced else 0
        finally:
            tracemalloc.stop()

    run("warm", False, False)   # one-time allocations (lazy imports, caches) outside the measurement
    peak_plain = run("plain", False, True)
    peak_hidden = run("hidden", True, True)
    hidden = read_array(tmp_path / "hidden", "hidden")
    tr = read_trace(tmp_path / "hidden")
    assert hidden.shape == (tr.n_tokens, 4, 1536)
    # numpy buffers are traced (torch's are not): the shard's hidden states (~4 MB) must never all be in RAM
    # at once; hashing the written file costs a fixed ~2 MB of read buffers whatever the size
    extra = peak_hidden - peak_plain
    assert extra < hidden.nbytes / 2 + 2**21, (extra, hidden.nbytes)


def test_unusable_output_is_refused_before_the_model_loads(tmp_path):
    """An output that is a file, or a non-empty directory of something else, fails at once (not after minutes of
    loading a large model): the message is about -o although the model does not even exist."""
    prompts = write_prompts(tmp_path / "p.jsonl")
    afile = tmp_path / "afile"
    afile.write_text("x")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    for out, match in ((afile, "not a directory"), (foreign, "not empty")):
        res = CliRunner().invoke(main, ["collect", str(tmp_path / "no-such-model"), "--prompts", str(prompts),
                                        "-o", str(out)])
        assert res.exit_code == 2 and match in res.output and "Traceback" not in res.output, res.output
    assert afile.read_text() == "x" and tree_bytes(foreign) == {"notes.txt": b"mine"}


@pytest.mark.parametrize("args, match", [
    (["--device", "foo"], "--device"),
    (["--device", "cuda:7"], "--device"),
    (["--device-map", "bogus"], "--device-map"),
])
def test_bad_device_is_one_line_before_loading(tmp_path, args, match):
    if "cuda:7" in args and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    prompts = write_prompts(tmp_path / "p.jsonl")
    res = CliRunner().invoke(main, ["collect", str(tmp_path / "no-such-model"), "--prompts", str(prompts),
                                    "-o", str(tmp_path / "o"), *args])
    assert res.exit_code == 2 and match in res.output and "Traceback" not in res.output, res.output
    assert "cannot load the model config" not in res.output and not (tmp_path / "o").exists()


def test_loading_options_with_a_loaded_model_are_refused(tmp_path):
    """--device/--device-map/--dtype/--revision act only when collect loads the model itself; with a model already
    in memory they would be recorded in the manifest without having been applied."""
    model, tok = make_model("qwen3_moe"), make_tokenizer()
    prompts = write_prompts(tmp_path / "p.jsonl")
    for over in (dict(device="cpu"), dict(dtype="bfloat16"), dict(revision="main"), dict(device_map="auto")):
        with pytest.raises(ValidationError, match="loaded model"):
            collect(model, prompts, tmp_path / "o", CollectConfig(max_new_tokens=1, **over), tokenizer=tok)
    assert not (tmp_path / "o").exists()


def test_resume_accepts_the_same_model_directory_spelled_differently(tmp_path, monkeypatch):
    """Regression: the identity held the model argument verbatim, so resuming with `models/m/` (shell
    completion adds the slash) or `./models/m` after starting with `models/m` was refused as another model."""
    model, tok = make_model("olmoe", seed=8), make_tokenizer()
    (tmp_path / "models").mkdir()
    model.save_pretrained(tmp_path / "models" / "m")
    tok.save_pretrained(tmp_path / "models" / "m")
    prompts = write_prompts(tmp_path / "p.jsonl")
    monkeypatch.chdir(tmp_path)
    args = ["--prompts", "p.jsonl", "-o", "t", "--max-new-tokens", "2", "--batch-size", "5", "--shard-size", "5",
            "--json"]
    res = CliRunner().invoke(main, ["collect", "models/m", *args])
    assert res.exit_code == 0, res.output
    assert read_trace(tmp_path / "t").provenance["model"] == "models/m"
    for spelling in ("models/m/", "./models/m", "models//m"):
        res = CliRunner().invoke(main, ["collect", spelling, *args])
        assert res.exit_code == 0 and json.loads(res.stdout.strip().splitlines()[-1])["already_complete"], res.output
    assert prompts.exists()


def test_chat_template_refusing_a_row_names_the_line(tmp_path):
    """A chat template that raises (e.g. 'System role not supported', roles not alternating) is the prompt row's
    fault: one line naming file and row, not a jinja2 traceback, and nothing written."""
    model, tok = make_model("mixtral", seed=1), make_tokenizer()
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}"
                         "{{ raise_exception('System role not supported') }}{% endif %}"
                         "<{{ m['role'] }}> {{ m['content'] }} {% endfor %}<assistant> ")
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    prompts = write_prompts(tmp_path / "p.jsonl")   # row 2 holds a system message
    res = CliRunner().invoke(main, ["collect", str(tmp_path / "m"), "--prompts", str(prompts), "-o",
                                    str(tmp_path / "o"), "--max-new-tokens", "1"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "record 2" in res.output and "System role not supported" in res.output
    assert not (tmp_path / "o").exists()


def test_prompt_and_tokenizer_errors_come_before_the_weights_load(tmp_path, monkeypatch):
    """A missing tokenizer or a prompt row the tokenizer cannot encode fails before minutes of weight loading."""
    model, tok = make_model("olmoe", seed=1), make_tokenizer()
    model.save_pretrained(tmp_path / "m")
    tok.chat_template = None
    tok.save_pretrained(tmp_path / "m")
    model.save_pretrained(tmp_path / "no-tok")

    def loading_weights(*args, **kwargs):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loading_weights)
    prompts = write_prompts(tmp_path / "p.jsonl")   # row 2 is a chat, and this tokenizer has no template
    for model_dir, match in (("m", "no chat template"), ("no-tok", "cannot load the tokenizer")):
        res = CliRunner().invoke(main, ["collect", str(tmp_path / model_dir), "--prompts", str(prompts), "-o",
                                        str(tmp_path / "o")])
        assert res.exit_code == 2 and match in res.output and "Traceback" not in res.output, res.output
        assert not (tmp_path / "o").exists()
