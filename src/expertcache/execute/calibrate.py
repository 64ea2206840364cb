"""Measure a hardware profile on this machine: the model's real layers and real host->device copies (needs torch).

``expertcache timing calibrate MODEL`` (docs/timing.md, *Calibration*). The executor runs the prompts with
every expert allowed to stay resident (``lru`` at capacity ``c = N``: each block is copied once, at its first
use, and every later access hits), once per batch size, so that the per-token and per-expert costs vary and
can be told apart. Per forward and per MoE layer it records, with the executor's own span timer (CUDA events on
a GPU, ``perf_counter_ns`` on CPU):

* the executor's spans: the MoE block (``layer``), every copy (``copy``) and the forward (``forward``);
* one more span per MoE decoder layer (a forward pre-hook and hook on the decoder layer module), so the layer's
  dense work is the decoder layer minus its MoE block, and the step's own cost is the forward minus its MoE
  decoder layers (embedding, dense-only layers, final norm, head).

The link is timed apart from the runs: repeated copies host -> device of buffers of one and four expert blocks
(pinned host memory and ``non_blocking`` on CUDA, as the executor copies; a plain ``copy_`` on CPU). The fit
itself is :func:`expertcache.timing.calibrate.fit_profile`.

The profile says ``overlap: false`` on both devices, because that is what this executor does: on CPU a copy
is a ``memcpy`` on the computing thread; on CUDA its ``non_blocking`` copies are issued on the current stream,
the stream the layers compute on, so a copy waits for the kernels queued before it and the kernels after it
wait for the copy (stream order): the link and compute alternate, as under the blocking contract. An engine
that copies on a stream of its own can set ``overlap: true`` in the profile by hand.
"""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..timing.calibrate import CalibrationSpans, fit_profile
from ..timing.profile import HardwareProfile

__all__ = ["CalibrateConfig", "measure_spans", "time_copies", "profile_from_spans", "calibrate"]


@dataclass(frozen=True)
class CalibrateConfig:
    """What ``expertcache timing calibrate`` runs.

    Attributes
    ----------
    batches
        Concurrencies ``B`` of the calibration runs (at least one; two or more make per-token costs
        identifiable: decode forwards then carry from 1 to ``max(B)`` tokens).
    max_new_tokens, max_prompt_tokens, chat_template
        As in ``expertcache execute``.
    device, dtype, experts_implementation
        As in ``expertcache execute``; the profile holds for runs with the same ones.
    copy_repeats
        Timed copies per buffer size for the link (each size, interleaved).
    threads
        torch CPU threads during the measurement (``None``: leave torch's setting).
    clock
        CPU span clock (:data:`~expertcache.execute.timings.CLOCKS`): ``"wall"``, what ``expertcache
        execute`` records, or ``"cpu"``, the executing thread's CPU time (steadier on a shared machine; with
        one torch thread). Ignored on CUDA (CUDA events).
    rounds
        The whole measurement (every batch size, then the link) is repeated this many times and the spans
        pooled: on a machine shared with other work, one fit over a longer stretch of its load.
    """

    batches: tuple[int, ...] = (1, 8)
    max_new_tokens: int = 32
    max_prompt_tokens: int = 4096
    chat_template: bool = True
    device: str = "cpu"
    dtype: str = "auto"
    experts_implementation: str | None = "eager"
    copy_repeats: int = 200
    threads: int | None = None
    clock: str = "wall"
    rounds: int = 1

    def __post_init__(self) -> None:
        from .timings import CLOCKS

        if self.clock not in CLOCKS:
            raise ValidationError(f"clock must be one of {', '.join(CLOCKS)}; got {self.clock!r}", field="clock")
        if not self.batches or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.batches):
            raise ValidationError(f"batches must be integers >= 1; got {self.batches!r}", field="batch")
        for name, lo in (("max_new_tokens", 1), ("copy_repeats", 3), ("rounds", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValidationError(f"{name} must be an integer >= {lo}; got {v!r}", field=name)
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise ValidationError(f"threads must be an integer >= 1; got {self.threads!r}", field="threads")


def _decoder_modules(model: Any, layers: Sequence[Any]) -> list[Any]:
    """The decoder layer module of each MoE layer (the module whose name ends in ``layers.<index>``)."""
    modules = dict(model.named_modules())
    out = []
    for lay in layers:
        head = lay.name.split(f"layers.{lay.decoder_layer}.", 1)[0]
        mod = modules.get(f"{head}layers.{lay.decoder_layer}")
        if mod is None:
            raise ValidationError(f"cannot find the decoder layer of router {lay.name!r}", field="model")
        out.append(mod)
    return out


def _run_once(executor: Any, encoded: list[list[int]], request_ids: list[str],
              progress: Callable[[int, int], None] | None) -> Any:
    """Run ``executor`` with a ``decoder`` span around every MoE decoder layer (kind ``decoder``)."""
    decoders = _decoder_modules(executor.model, executor.layers)
    open_tokens: dict[int, Any] = {}
    handles = []
    for li, mod in enumerate(decoders):
        def pre(module: Any, args: Any, li: int = li) -> None:
            open_tokens[li] = executor.timer.begin()

        def post(module: Any, args: Any, output: Any, li: int = li) -> None:
            executor.timer.end(open_tokens.pop(li), "decoder", executor._forward, executor._phase, li)

        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
    try:
        return executor.run(encoded, request_ids, progress=progress)
    finally:
        for h in handles:
            h.remove()


def measure_spans(model_id: str, prompts: str | os.PathLike[str], config: CalibrateConfig,
                  progress: Callable[[str, int, int], None] | None = None) -> tuple[CalibrationSpans, dict[str, Any]]:
    """Run the calibration executions and the link timing; the spans and a description of the model.

    Returns
    -------
    spans
        :class:`~expertcache.timing.calibrate.CalibrationSpans` (seconds).
    info
        ``n_layers``, ``n_experts``, ``top_k``, ``expert_bytes``, ``model_type``, ``torch``, ``device_name``.
    """
    import torch

    from ..collect import CollectConfig, read_prompts
    from ..collect.runner import check_placement, encode_prompt, load_tokenizer, load_weights
    from .config import ExecuteConfig
    from .runner import Executor, _eos_ids
    from .stream import executed_stream

    ccfg = CollectConfig(max_new_tokens=config.max_new_tokens, max_prompt_tokens=config.max_prompt_tokens,
                         chat_template=config.chat_template, dtype=config.dtype,
                         device=None if config.device == "cpu" else config.device)
    check_placement(ccfg)
    records = read_prompts(prompts)
    tokenizer = load_tokenizer(model_id, ccfg)
    encoded = [encode_prompt(tokenizer, r, ccfg)[0] for r in records]
    request_ids = [r.request_id for r in records]
    threads_before = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("layer", "tokens", "members", "routed", "dense", "moe",
                                                          "step_tokens", "step_other", "transfer", "event_decode",
                                                          "step_decode")}
    info: dict[str, Any] = {}
    try:
        for B in config.batches:
            model = load_weights(model_id, replace(ccfg, device=None))
            ex_cfg = ExecuteConfig(policy="lru", rho=1.0, batch=B, max_new_tokens=config.max_new_tokens,
                                   max_prompt_tokens=config.max_prompt_tokens, chat_template=config.chat_template,
                                   tie_break="id", device=config.device, dtype=config.dtype,
                                   experts_implementation=config.experts_implementation)
            # rho 1 is c = N in every layer (the quota rule): nothing is ever evicted
            executor = Executor(model, ex_cfg, eos_token_ids=_eos_ids(model, tokenizer), clock=config.clock)
            res = _run_once(executor, encoded, request_ids,
                            (lambda d, n, B=B: progress(f"B={B}", d, n)) if progress else None)
            _collect(res, executed_stream(res.trace, B).stream, cols)
            info = {"n_layers": executor.L, "n_experts": executor.N, "top_k": executor.k,
                    "expert_bytes": int(executor.host.block_bytes), "model_type": model.config.model_type,
                    "dtype": str(executor.dtype).removeprefix("torch.")}
            del executor, model, res
        if progress:
            progress("link", 0, 1)
        link = time_copies([info["expert_bytes"], 4 * info["expert_bytes"]], config.copy_repeats, config.device,
                           config.clock)
        if progress:
            progress("link", 1, 1)
    finally:
        torch.set_num_threads(threads_before)
    cat = {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}
    copy_bytes = np.concatenate([np.full(len(s), b, dtype=np.int64) for b, s in link.items()])
    copy_s = np.concatenate([np.asarray(s, dtype=np.float64) for s in link.values()])
    spans = CalibrationSpans(
        cat["layer"].astype(np.int64), cat["tokens"].astype(np.int64), cat["members"].astype(np.int64),
        cat["routed"].astype(np.int64), cat["dense"].astype(np.float64), cat["moe"].astype(np.float64),
        cat["step_tokens"].astype(np.int64), cat["step_other"].astype(np.float64), copy_bytes, copy_s,
        cat["transfer"].astype(np.float64), cat["event_decode"].astype(bool), cat["step_decode"].astype(bool))
    dev = torch.device(config.device)
    info["torch"] = torch.__version__
    info["device_name"] = (torch.cuda.get_device_name(dev) if dev.type == "cuda" else
                           (platform.processor() or platform.machine() or "cpu"))
    info["threads"] = config.threads if config.threads is not None else threads_before
    return spans, info


def _collect(res: Any, stream: Any, cols: dict[str, list[np.ndarray]]) -> None:
    """The per-event and per-forward spans of one calibration run (events with a copy are left out of the
    MoE fit: their span holds the copy; their dense part is kept)."""
    t = res.timings
    kind = t["kind"]
    ns = t["ns"].astype(np.float64) / 1e9
    fwd, lay = t["forward"], t["layer"]
    L = stream.n_layers
    n_fwd = int(res.n_forwards)
    moe = np.full((n_fwd, L), np.nan)
    dec = np.full((n_fwd, L), np.nan)
    for name, dst in (("layer", moe), ("decoder", dec)):
        m = kind == name
        dst[fwd[m], lay[m]] = ns[m]
    forward = np.full(n_fwd, np.nan)
    m = kind == "forward"
    forward[fwd[m]] = ns[m]
    log = res.event_log                       # forward, layer, phase, hits, misses
    members = np.zeros((n_fwd, L), dtype=np.int64)
    misses = np.zeros((n_fwd, L), dtype=np.int64)
    members[log[:, 0], log[:, 1]] = log[:, 3] + log[:, 4]
    misses[log[:, 0], log[:, 1]] = log[:, 4]
    tokens = np.zeros(n_fwd, dtype=np.int64)
    tokens[stream.step[::L]] = stream.active[::L]
    if np.isnan(moe).any() or np.isnan(dec).any() or np.isnan(forward).any():
        raise RuntimeError("calibration run: a forward or layer has no span")
    f_idx, l_idx = np.nonzero(misses == 0)
    cols["layer"].append(l_idx)
    cols["tokens"].append(tokens[f_idx])
    cols["members"].append(members[f_idx, l_idx])
    cols["routed"].append(tokens[f_idx] * stream.top_k)
    cols["moe"].append(moe[f_idx, l_idx])
    cols["dense"].append(dec[f_idx, l_idx] - moe[f_idx, l_idx])
    cols["step_tokens"].append(tokens)
    cols["step_other"].append(forward - dec.sum(axis=1))
    phase = np.zeros(n_fwd, dtype=np.int64)
    phase[log[:, 0]] = log[:, 2]
    cols["event_decode"].append(phase[f_idx] == 1)
    cols["step_decode"].append(phase == 1)
    cols["transfer"].append(ns[kind == "copy"])


def time_copies(sizes: Sequence[int], repeats: int, device: str, clock: str = "wall") -> dict[int, list[float]]:
    """Seconds of ``repeats`` host -> ``device`` copies of a buffer of each size (bytes), interleaved.

    On CUDA the host buffer is pinned and the copy ``non_blocking`` (as the executor's), timed with CUDA
    events around the copy on the current stream, then synchronised; on CPU a ``copy_`` between two host
    buffers timed with ``clock`` (:data:`~expertcache.execute.timings.CLOCKS`). Five untimed warm-up rounds
    come first.
    """
    import torch

    from .timings import CLOCKS

    now = CLOCKS[clock]
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    pairs = []
    for n in sizes:
        src = torch.empty(int(n), dtype=torch.uint8)
        src.random_(0, 255, generator=torch.Generator().manual_seed(int(n)))
        if cuda:
            src = src.pin_memory()
        pairs.append((int(n), src, torch.empty(int(n), dtype=torch.uint8, device=dev)))
    out: dict[int, list[float]] = {n: [] for n, _, _ in pairs}
    for rep in range(repeats + 5):
        for n, src, dst in pairs:
            if cuda:
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                dst.copy_(src, non_blocking=True)
                b.record()
                b.synchronize()
                dt = a.elapsed_time(b) / 1e3
            else:
                t0 = now()
                dst.copy_(src)
                dt = (now() - t0) / 1e9
            if rep >= 5:
                out[n].append(dt)
    return out


def calibrate(model_id: str, prompts: str | os.PathLike[str], config: CalibrateConfig = CalibrateConfig(),
              progress: Callable[[str, int, int], None] | None = None) -> HardwareProfile:
    """Measure (``config.rounds`` times, pooled) and fit a :class:`~expertcache.timing.HardwareProfile` for
    ``model_id`` on this machine (docs/timing.md, *Calibration*)."""
    parts, info = [], {}
    for r in range(config.rounds):
        def prog(name: str, d: int, n: int, r: int = r) -> None:
            if progress:
                progress(name if config.rounds == 1 else f"round {r + 1}/{config.rounds} {name}", d, n)

        spans, info = measure_spans(model_id, prompts, config, prog)
        parts.append(spans)
    return profile_from_spans(CalibrationSpans.concat(parts), info, config, model_id)


def profile_from_spans(spans: CalibrationSpans, info: dict[str, Any], config: CalibrateConfig,
                       model_id: str | os.PathLike[str]) -> HardwareProfile:
    """The fitted profile of measured ``spans`` (:func:`measure_spans`), with its ``source`` naming the machine,
    device, torch version, clock, model and date, and ``extra`` the settings and fit residuals."""
    cuda = config.device.startswith("cuda")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    model_name = os.path.basename(os.path.normpath(os.fspath(model_id)))
    clock = "cuda-events" if cuda else config.clock
    source = (f"measured by expertcache timing calibrate on {platform.node() or 'this machine'} "
              f"({info['device_name']}), device {config.device}, torch {info['torch']}, {info['threads']} CPU "
              f"thread(s), {clock} clock, model {model_name} ({info['model_type']}, {info['dtype']}, experts "
              f"{config.experts_implementation or 'model default'}), {config.rounds} round(s) at B = "
              f"{','.join(map(str, config.batches))}, {when}")
    extra = {"model": os.fspath(model_id), "device": config.device, "torch": info["torch"],
             "threads": info["threads"], "clock": clock, "batches": list(config.batches),
             "rounds": config.rounds, "max_new_tokens": config.max_new_tokens,
             "experts_implementation": config.experts_implementation, "date": when}
    return fit_profile(spans, n_layers=info["n_layers"], expert_bytes=info["expert_bytes"],
                       name=f"calibrated-{model_name}-{config.device.replace(':', '')}", source=source,
                       overlap=False, extra=extra)
