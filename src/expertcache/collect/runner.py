"""Run a transformers MoE model over a prompt set and record its routing (§3.3; needs torch).

Per batch: prompts are left-padded, ``model.generate`` decodes greedily while
:class:`~expertcache.collect.recorder.RouterRecorder` keeps each router's own
outputs, and the recorded columns are cut back to each sequence's real tokens:

- the prefill forward covers columns ``[0, T0)`` of the padded batch; row ``b``
  owns the last ``P_b`` of them (its prompt, positions ``0..P_b-1``);
- decode forward ``j`` (``j >= 0``) processes generated token ``g_j`` at column
  ``T0 + j`` (position ``P_b + j``); it is recorded for ``j < D_b`` where
  ``D_b`` is the index of the first EOS in ``g`` (an EOS is never forwarded when a
  request runs alone, so it is not recorded in a batch either) or
  ``max_new_tokens`` when there is none. Later columns of a finished row are
  padding and are dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import __version__
from ..errors import ValidationError
from ..trace import RoutingTrace
from . import store
from .adapters import MoELayer, RouterAdapter, adapter_for, find_moe_layers
from .config import CollectConfig
from .prompts import PromptRecord, prompt_set_sha256, read_prompts
from .recorder import RouterRecorder, router_stats

__all__ = ["collect", "CollectResult", "ProgressEvent", "load_model", "load_tokenizer", "load_weights", "encode_prompt",
           "check_placement"]


@dataclass(frozen=True)
class ProgressEvent:
    """Reported after each batch (or skipped shard): counts so far and of this step."""

    prompts_done: int
    prompts_total: int
    tokens: int          # routed tokens (prefill + decode) recorded by this batch
    decode_tokens: int   # of which decode
    seconds: float       # wall time of this batch's generate (0 for skipped shards)
    shard: int
    skipped: bool


@dataclass(frozen=True)
class CollectResult:
    """What a collection run did."""

    out: Path
    n_requests: int
    n_tokens: int
    n_decode_tokens: int
    n_shards: int
    n_shards_skipped: int
    already_complete: bool
    generate_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"out": str(self.out), "n_requests": self.n_requests, "n_tokens": self.n_tokens,
                "n_decode_tokens": self.n_decode_tokens, "n_shards": self.n_shards,
                "n_shards_skipped": self.n_shards_skipped, "already_complete": self.already_complete,
                "generate_seconds": self.generate_seconds}


#: Files of which a local model directory must hold at least one to have a tokenizer.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                    "spiece.model")


def load_tokenizer(model_id: str, config: CollectConfig) -> Any:
    """Check placement, config and architecture, and load the tokenizer: everything short of the weights.

    Bad options, an unsupported architecture or a missing tokenizer fail here, before the
    (possibly minutes-long) weight loading.
    """
    from transformers import AutoConfig, AutoTokenizer

    check_placement(config)
    try:
        hf_config = AutoConfig.from_pretrained(model_id, revision=config.revision)
    except (OSError, ValueError, KeyError) as exc:
        raise ValidationError(f"cannot load the model config ({str(exc).splitlines()[0]}); expected a local "
                              "model directory or a Hugging Face model id in the local cache",
                              source=model_id) from None
    adapter_for(hf_config)  # unsupported architecture: fail before loading weights
    if os.path.isdir(model_id) and not any(os.path.isfile(os.path.join(model_id, f)) for f in _TOKENIZER_FILES):
        # transformers 5 would build an empty tokenizer (every prompt encodes to nothing) instead of failing
        raise ValidationError(f"cannot load the tokenizer: the model directory holds none of "
                              f"{', '.join(_TOKENIZER_FILES)}; save it beside the weights "
                              "(tokenizer.save_pretrained(model_dir))", source=model_id)
    try:
        return AutoTokenizer.from_pretrained(model_id, revision=config.revision)
    except (OSError, ValueError) as exc:
        raise ValidationError(f"cannot load the tokenizer ({str(exc).splitlines()[0]})", source=model_id) from None


def load_weights(model_id: str, config: CollectConfig) -> Any:
    """Load the causal LM with transformers' Auto class, placed and cast as ``config`` says, in eval mode."""
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"revision": config.revision,
                              "dtype": "auto" if config.dtype == "auto" else getattr(torch, config.dtype)}
    if config.device_map is not None:
        kwargs["device_map"] = config.device_map
    model = AutoModelForCausalLM.from_pretrained(model_id, **kwargs)
    if config.device is not None:
        model.to(config.device)
    return model.eval()


def load_model(model_id: str, config: CollectConfig) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)``; everything that can fail without the weights fails first."""
    tokenizer = load_tokenizer(model_id, config)
    return load_weights(model_id, config), tokenizer


_DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def check_placement(config: CollectConfig) -> None:
    """Check ``--device`` / ``--device-map`` against this torch before any weight is loaded.

    Raises
    ------
    ValidationError
        A string that is no torch device, a CUDA/MPS device this machine does not have, an unknown
        ``device_map``, or ``device_map`` without the ``accelerate`` package transformers needs for it.
    """
    import importlib.util

    def device(value: str, flag: str) -> None:
        try:
            dev = torch.device(value)
        except (RuntimeError, ValueError):
            raise ValidationError(f"{flag} expects a torch device such as cpu, cuda, cuda:1 or mps; got {value!r}",
                                  field=flag.lstrip("-").replace("-", "_")) from None
        if dev.type == "cuda":
            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if n == 0:
                raise ValidationError(f"{flag} {value}: this torch {torch.__version__} sees no CUDA device; "
                                      "use --device cpu", field=flag.lstrip("-").replace("-", "_"))
            if dev.index is not None and dev.index >= n:
                raise ValidationError(f"{flag} {value}: this machine has {n} CUDA device(s), cuda:0..cuda:{n - 1}",
                                      field=flag.lstrip("-").replace("-", "_"))
        elif dev.type == "mps" and not torch.backends.mps.is_available():
            raise ValidationError(f"{flag} {value}: MPS is not available here; use --device cpu",
                                  field=flag.lstrip("-").replace("-", "_"))

    if config.device is not None:
        device(config.device, "--device")
    if config.device_map is not None:
        if config.device_map not in _DEVICE_MAPS:
            try:
                device(config.device_map, "--device-map")
            except ValidationError:
                raise ValidationError(f"--device-map expects one of {', '.join(_DEVICE_MAPS)} or a device name; "
                                      f"got {config.device_map!r}", field="device_map") from None
        if importlib.util.find_spec("accelerate") is None:
            raise ValidationError("--device-map needs the accelerate package (pip install accelerate); "
                                  "or place the whole model with --device", field="device_map")


def _template_reads(tokenizer: Any, flag: str) -> bool:
    t = getattr(tokenizer, "chat_template", None)
    texts = t.values() if isinstance(t, dict) else [t]
    return any(isinstance(x, str) and flag in x for x in texts)


def encode_prompt(tokenizer: Any, record: PromptRecord, config: CollectConfig) -> tuple[list[int], int]:
    """Token ids of one prompt (chat template per §3.3) capped to ``max_prompt_tokens``, and the count dropped."""
    if config.chat_template and getattr(tokenizer, "chat_template", None):
        messages = list(record.messages or ({"role": "user", "content": record.prompt},))
        extra = {"enable_thinking": False} if _template_reads(tokenizer, "enable_thinking") else {}
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
        except Exception as exc:   # jinja2 TemplateError (raise_exception in the template), or its own checks
            if type(exc).__name__ != "TemplateError" and not isinstance(exc, ValueError):
                raise
            raise ValidationError(f"the model's chat template refused this row ({str(exc).splitlines()[0]})",
                                  record=record.line, field="messages" if record.messages else "prompt") from None
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    else:
        if record.messages is not None:
            raise ValidationError("row has 'messages' but the tokenizer has no chat template (or "
                                  "--no-chat-template was given); give 'prompt' text instead",
                                  record=record.line, field="messages")
        ids = list(tokenizer(record.prompt)["input_ids"])
    if not ids:
        raise ValidationError("the prompt tokenizes to no tokens", record=record.line, field="prompt")
    cap = config.max_prompt_tokens
    dropped = max(0, len(ids) - cap)
    return ids[dropped:], dropped


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return []
    return sorted({int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])})


def _sha_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _config_sha256(hf_config: Any) -> str:
    d = hf_config.to_dict()
    for key in ("_name_or_path", "transformers_version", "_commit_hash", "name_or_path"):
        d.pop(key, None)
    return _sha_json(d)


def _router_sha256(layers: list[MoELayer]) -> str:
    digest = hashlib.sha256()
    for layer in layers:
        for name, t in sorted(layer.router.state_dict().items()):
            digest.update(name.encode())
            digest.update(t.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def _expert_block_bytes(layers: list[MoELayer], n_experts: int) -> int | None:
    experts = layers[0].experts
    if experts is None:
        return None
    total = sum(p.numel() * p.element_size() for p in experts.parameters())
    return int(total // n_experts) if total else None


def _input_device(model: Any) -> torch.device:
    return model.get_input_embeddings().weight.device


@dataclass(frozen=True)
class _Routed:
    """Routes of one request (rows = its tokens, prefill then decode)."""

    experts: np.ndarray    # int16[n, L, k]
    gates: np.ndarray      # float32[n, L, k]
    probs: np.ndarray      # float32[n, L, k]
    entropy: np.ndarray    # float32[n, L]
    margin: np.ndarray     # float32[n, L]
    token_id: np.ndarray   # int64[n]
    n_prompt: int
    n_decode: int
    stop: str
    arrays: dict[str, np.ndarray]


def _run_batch(model: Any, recorder: RouterRecorder, adapter: RouterAdapter, batch: list[list[int]],
               config: CollectConfig, eos: list[int], pad_id: int) -> list[_Routed]:
    from transformers import GenerationConfig

    B, T0 = len(batch), max(len(ids) for ids in batch)
    input_ids = torch.full((B, T0), pad_id, dtype=torch.long)
    attention = torch.zeros((B, T0), dtype=torch.long)
    for b, ids in enumerate(batch):   # left padding: each prompt ends at column T0 - 1
        input_ids[b, T0 - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention[b, T0 - len(ids):] = 1
    device = _input_device(model)
    gen = GenerationConfig(max_new_tokens=config.max_new_tokens + 1, do_sample=False, num_beams=1,
                           eos_token_id=eos or None, pad_token_id=pad_id)
    recorder.clear()
    # generate() fills every unset field from model.generation_config (repetition penalties, suppressed
    # tokens, n-gram bans, ...); swap in a bare one so decoding is plain greedy argmax (§3.3).
    saved = model.generation_config
    model.generation_config = GenerationConfig(eos_token_id=eos or None, pad_token_id=pad_id)
    try:
        with torch.no_grad():
            seqs = model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                                  generation_config=gen)
    finally:
        model.generation_config = saved
    seqs = seqs.cpu()
    n_steps = len(recorder.calls[0])
    for li, calls in enumerate(recorder.calls):
        if len(calls) != n_steps:
            raise ValidationError(f"MoE layer {li}'s router ran {len(calls)} times, layer 0's {n_steps}: the "
                                  "router hooks did not see every forward (a fused kernel replaced the MoE "
                                  "block?)", field="model")
    expected_cols = seqs.shape[1] - 1
    if n_steps == 0 or recorder.calls[0][0][0].shape[0] != B * T0 or T0 + n_steps - 1 != expected_cols:
        raise ValidationError(f"unexpected forward pattern in generate ({n_steps} forwards for "
                              f"{seqs.shape[1] - T0} new tokens); expected one prefill then one-token decode "
                              "steps", field="model")
    # Each sequence's real columns: its prompt [T0 - P, T0) and its D recorded decode forwards.
    eos_set = set(eos)
    spans: list[tuple[int, int, str]] = []   # (P, D, stop) per sequence
    for b, ids in enumerate(batch):
        P = len(ids)
        if seqs[b, T0 - P:T0].tolist() != ids:
            raise ValidationError("generate changed the prompt tokens; cannot align routes", field="model")
        gen_tokens = seqs[b, T0:].tolist()
        first_eos = next((j for j, t in enumerate(gen_tokens) if t in eos_set), None)
        D = first_eos if first_eos is not None else len(gen_tokens) - 1
        spans.append((P, min(D, config.max_new_tokens), "eos" if first_eos is not None else "length"))
    L = len(recorder.calls)
    # One layer at a time: its (B, Tt, .) tensor over all columns (statistics in one go), each sequence's
    # rows copied into that sequence's own (n_b, L, .) array, then the layer's recorded calls released,
    # so a batch's hidden states are held about once, not once per copy.
    rows: dict[str, list[np.ndarray]] = {}

    def put(name: str, li: int, full: torch.Tensor, dtype: type) -> None:
        arr = full.cpu().numpy()
        if name not in rows:
            rows[name] = [np.empty((P + D, L, *arr.shape[2:]), dtype) for P, D, _ in spans]
        for b, (P, D, _) in enumerate(spans):
            rows[name][b][:, li] = arr[b, T0 - P:T0 + D]

    for li, calls in enumerate(recorder.calls):
        def cols(i: int, calls=calls) -> torch.Tensor:
            first = calls[0][i].reshape(B, T0, -1)
            rest = [c[i].reshape(B, 1, -1) for c in calls[1:]]
            return torch.cat([first, *rest], dim=1)

        logits = cols(0)
        idx = cols(2)
        st = router_stats(logits, idx, adapter.score)
        put("experts", li, idx.to(torch.int16), np.int16)
        put("gates", li, cols(1).float(), np.float32)
        put("probs", li, st.probs, np.float32)
        put("entropy", li, st.entropy, np.float32)
        put("margin", li, st.margin, np.float32)
        if config.save_logits:
            put("logits", li, logits.to(torch.float16), np.float16)
        del logits, idx, st
        if config.save_hidden:
            put("hidden", li, cols(3), np.float16)
        calls.clear()
    recorder.clear()
    out = []
    for b, (P, D, stop) in enumerate(spans):
        lo, hi = T0 - P, T0 + D
        arrays = {name: rows[name][b] for name in ("logits", "hidden") if name in rows}
        out.append(_Routed(rows["experts"][b], rows["gates"][b], rows["probs"][b], rows["entropy"][b],
                           rows["margin"][b], seqs[b, lo:hi].numpy().astype(np.int64), P, D, stop, arrays))
    return out


def collect(model: Any, prompts: str | os.PathLike[str], out: str | os.PathLike[str],
            config: CollectConfig | None = None, *, tokenizer: Any = None, model_id: str | None = None,
            progress: Callable[[ProgressEvent], None] | None = None) -> CollectResult:
    """Record the routing of ``model`` on every prompt of ``prompts`` into the trace directory ``out``.

    Parameters
    ----------
    model
        A model directory or Hugging Face id (loaded with the Auto classes), or a
        loaded transformers causal LM (then ``tokenizer`` is required).
    prompts
        Prompts JSONL (:func:`~expertcache.collect.prompts.read_prompts`).
    out
        Output trace directory. An existing one is resumed if it holds this very
        collection (same model, config, router weights, prompts, parameters and
        versions), refused otherwise.
    config
        Collection parameters (§3.3 defaults).
    tokenizer
        Tokenizer to use with a loaded ``model``.
    model_id
        Name recorded in the manifest for a loaded ``model`` (default: its ``name_or_path``).
    progress
        Called after every batch and every skipped shard.

    Returns
    -------
    CollectResult
    """
    import transformers

    config = config or CollectConfig()
    records = read_prompts(prompts)
    out = Path(out)
    store.check_output(out)   # an unusable -o fails before a large model spends minutes loading
    if isinstance(model, (str, os.PathLike)):
        # A local directory's name as given, normalised (``m/``, ``./m``, ``m`` are one model for resume).
        model_id = model_id or (os.path.normpath(model) if os.path.isdir(model) else os.fspath(model))
        model_path: str | None = os.fspath(model)
        tokenizer = load_tokenizer(model_path, config)
    else:
        model_path = None
        if tokenizer is None:
            raise ValidationError("a loaded model needs its tokenizer", field="tokenizer")
        given = [f"{name}={getattr(config, name)!r}" for name in ("device", "device_map", "revision")
                 if getattr(config, name) is not None] + ([f"dtype={config.dtype!r}"] if config.dtype != "auto" else [])
        if given:
            raise ValidationError(f"{', '.join(given)} only apply when collect loads the model; with a loaded model "
                                  "place and cast it yourself and leave them at their defaults", field="config")
        model_id = model_id or getattr(model, "name_or_path", None) or type(model).__name__
        adapter_for(model.config)
    encoded = []   # prompts the tokenizer or its chat template refuse fail before the weights load
    for rec in records:
        try:
            encoded.append(encode_prompt(tokenizer, rec, config))
        except ValidationError as exc:
            raise ValidationError(exc.detail, source=str(prompts), record=rec.line, field=exc.field) from None
    if model_path is not None:
        model = load_weights(model_path, config)
    hf_config = model.config
    adapter = adapter_for(hf_config)
    layers = find_moe_layers(model, adapter)
    N, k, L = adapter.n_experts(hf_config), adapter.top_k(hf_config), len(layers)
    if N > np.iinfo(np.int16).max:
        raise ValidationError(f"{N} experts exceed the trace's int16 expert ids", field="model")
    prompts_sha = prompt_set_sha256(prompts)
    identity = {"model": model_id, "model_type": hf_config.model_type, "config_sha256": _config_sha256(hf_config),
                "router_sha256": _router_sha256(layers), "prompts_sha256": prompts_sha,
                "params": config.to_dict(), "transformers_version": transformers.__version__,
                "torch_version": torch.__version__, "tool_version": __version__}
    csha = store.identity_sha256(identity)
    n_shards = -(-len(records) // config.shard_size)
    if store.check_identity(out, identity) and (out / "manifest.json").is_file():
        from ..trace import read_trace

        done_trace = read_trace(out)   # verifies the stored hashes
        return CollectResult(out, done_trace.n_requests, done_trace.n_tokens, int((done_trace.phase == 1).sum()),
                             n_shards, n_shards, True, 0.0)
    store.write_identity(out, identity)
    with store.collection_lock(out):   # one collect per directory at a time
        store.clean_partial(out)
        use_template = bool(config.chat_template and getattr(tokenizer, "chat_template", None))
        categories = {r.request_id: r.category for r in records if r.category is not None}
        provenance: dict[str, Any] = {
            "generator": "expertcache collect", "model": model_id, "model_type": hf_config.model_type,
            "revision": config.revision, "commit": getattr(hf_config, "_commit_hash", None),
            "config_sha256": identity["config_sha256"], "router_sha256": identity["router_sha256"],
            "transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "collection": config.to_dict(), "collection_sha256": csha,
            "prompts_file": os.path.basename(os.fspath(prompts)), "prompts_sha256": prompts_sha,
            "n_prompts": len(records), "chat_template": use_template,
            "enable_thinking": False if use_template and _template_reads(tokenizer, "enable_thinking") else None,
            "moe_layers": [lay.decoder_layer for lay in layers],
            "n_decoder_layers": int(getattr(hf_config, "num_hidden_layers", max(lay.decoder_layer for lay in layers) + 1)),
            "router_score": adapter.score, "router_class": adapter.router_class,
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "expert_block_bytes": _expert_block_bytes(layers, N),
            "eos_token_ids": _eos_ids(model, tokenizer),
            "decode_semantics": "decode row j = forward of generated token j at position prompt_len + j; "
                                "EOS is not forwarded; at most max_new_tokens decode rows",
        }
        if categories:
            provenance["categories"] = categories
        eos = _eos_ids(model, tokenizer)
        pad_id = getattr(tokenizer, "pad_token_id", None)
        pad_id = int(pad_id if pad_id is not None else (eos[0] if eos else 0))
        skipped = 0
        done = 0
        n_tok = n_dec = 0
        gen_seconds = 0.0
        with RouterRecorder(layers, save_hidden=config.save_hidden) as recorder:
            for s in range(n_shards):
                lo, hi = s * config.shard_size, min(len(records), (s + 1) * config.shard_size)
                if store.shard_done(out, s, csha):
                    skipped += 1
                    done = hi
                    if progress:
                        progress(ProgressEvent(done, len(records), 0, 0, 0.0, s, True))
                    continue
                routed: list[_Routed] = []
                with store.open_shard(out, s) as writer:
                    for blo in range(lo, hi, config.batch_size):
                        bhi = min(hi, blo + config.batch_size)
                        t0 = time.perf_counter()
                        res = _run_batch(model, recorder, adapter, [encoded[i][0] for i in range(blo, bhi)], config,
                                         eos, pad_id)
                        dt = time.perf_counter() - t0
                        gen_seconds += dt
                        for r in res:   # hidden states / logits go to disk now, not at the end of the shard
                            writer.append(r.arrays)
                        routed.extend(replace(r, arrays={}) for r in res)
                        del res
                        toks = sum(r.experts.shape[0] for r in routed[-(bhi - blo):])
                        decs = sum(r.n_decode for r in routed[-(bhi - blo):])
                        n_tok += toks
                        n_dec += decs
                        done = bhi
                        if progress:
                            progress(ProgressEvent(done, len(records), toks, decs, dt, s, False))
                    writer.finish(_shard_trace(records[lo:hi], encoded[lo:hi], routed, L, N, k, csha, s))
        trace = store.finalize(out, n_shards, provenance)
    return CollectResult(out, trace.n_requests, trace.n_tokens, int((trace.phase == 1).sum()), n_shards, skipped,
                         False, gen_seconds)


def _shard_trace(records: list[PromptRecord], encoded: list[tuple[list[int], int]], routed: list[_Routed],
                 L: int, N: int, k: int, csha: str, shard: int) -> RoutingTrace:
    n_rows = [r.experts.shape[0] for r in routed]
    request = np.repeat(np.arange(len(routed), dtype=np.int32), n_rows)
    phase = np.concatenate([np.r_[np.zeros(r.n_prompt, np.int8), np.ones(r.n_decode, np.int8)] for r in routed])
    position = np.concatenate([np.arange(n, dtype=np.int32) for n in n_rows])
    requests = {rec.request_id: {"prompt_tokens": r.n_prompt, "prompt_tokens_dropped": enc[1],
                                 "decode_tokens": r.n_decode, "stop": r.stop}
                for rec, enc, r in zip(records, encoded, routed, strict=True)}
    prov = {"collection_sha256": csha, "shard": shard, "requests": requests}
    return RoutingTrace(L, N, k, tuple(r.request_id for r in records), request, phase, position,
                        np.concatenate([r.experts for r in routed]), np.concatenate([r.gates for r in routed]),
                        np.concatenate([r.token_id for r in routed]), prov,
                        np.concatenate([r.probs for r in routed]), np.concatenate([r.entropy for r in routed]),
                        np.concatenate([r.margin for r in routed]))

