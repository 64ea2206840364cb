"""The offloading executor: FCFS continuous batching over a transformers MoE model whose routed experts
live in a host tier and run from a bounded device tier (needs torch).

Per forward (a request's prefill, or one decode step of every active request) and per MoE layer:

* **fused** contract: the union of the forward's selected experts is made resident (each miss is one
  copy host -> slot, into a free cache slot or the workspace), the model's own experts forward runs
  on the slot tensors with ``top_k_index`` remapped to slot ids, and only then the controller keeps
  its top ``c`` of ``C ∪ U`` (event-atomic, docs/semantics.md);
* **serialized** contract: the members one at a time in ascending expert id: classify, load if
  missing, compute that expert's tokens (the model's own forward with one expert per row),
  retain; the per-(token, slot) outputs are then reduced exactly as the model's implementation
  reduces them (sequential-ascending).

The KV cache is one left-padded ``DynamicCache`` over the active requests, rebuilt when the batch
changes (a request joins after its prefill, or leaves). With ``offload=False`` the same loop runs
the unmodified model: the reference the logits are compared with.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..collect.adapters import adapter_for, find_moe_layers
from ..collect.recorder import RouterRecorder, router_stats
from ..errors import ValidationError
from ..events import EventStream
from ..trace import RoutingTrace
from .config import ExecuteConfig
from .controller import NEVER, CacheController, pinned_blocks, tie_ranks
from .moe import PatchedExperts, expert_parameters
from .schedule import FcfsScheduler
from .tiers import DeviceTier, HostTier
from .timings import SpanTimer

__all__ = ["Executor", "ExecutionResult", "LayerPhaseCounts", "units_of_stream", "process_memory"]


@dataclass(frozen=True)
class LayerPhaseCounts:
    """Transfers of one MoE layer: hits and misses by phase, and the initial (static) load."""

    layer: int
    capacity: int
    slots: int
    prefill_hits: int
    prefill_misses: int
    decode_hits: int
    decode_misses: int
    initial_load: int

    @property
    def hits(self) -> int:
        return self.prefill_hits + self.decode_hits

    @property
    def misses(self) -> int:
        return self.prefill_misses + self.decode_misses

    @property
    def transferred(self) -> int:
        """Copies host -> device of this layer: misses plus the initial load."""
        return self.misses + self.initial_load

    def to_dict(self) -> dict[str, int]:
        return {"layer": self.layer, "capacity": self.capacity, "slots": self.slots,
                "prefill_hits": self.prefill_hits, "prefill_misses": self.prefill_misses,
                "decode_hits": self.decode_hits, "decode_misses": self.decode_misses,
                "initial_load": self.initial_load, "hits": self.hits, "misses": self.misses,
                "transferred": self.transferred}


@dataclass
class ExecutionResult:
    """What one execution did: outputs, routing, counts, memory and time."""

    config: ExecuteConfig
    offload: bool
    request_ids: tuple[str, ...]
    generated: list[list[int]]          # per request: g_0, g_1, ... (EOS included when it stopped on one)
    stop: list[str]
    trace: RoutingTrace
    per_layer: tuple[LayerPhaseCounts, ...]
    event_log: np.ndarray               # int64[n_events, 5]: forward, layer, phase, hits, misses
    transfers_copied: int               # copies the device tier actually performed (counted at the copy)
    memory: dict[str, Any]
    timings: dict[str, np.ndarray]
    wall_seconds: float
    n_forwards: int
    n_decode_steps: int
    logits: list[torch.Tensor] = field(default_factory=list, repr=False)

    @property
    def transferred(self) -> int:
        return int(sum(x.transferred for x in self.per_layer))

    @property
    def hits(self) -> int:
        return int(sum(x.hits for x in self.per_layer))

    def summary(self) -> dict[str, Any]:
        """The headline numbers (JSON-ready)."""
        t = self.timings
        dec = (t["kind"] == "forward") & (t["phase"] == 1) if len(t["kind"]) else np.zeros(0, bool)
        step_ns = t["ns"][dec] if len(t["kind"]) else np.zeros(0)
        n_dec_tokens = int(sum(len(g) for g in self.generated)) - sum(1 for s in self.stop if s == "eos")
        decode_s = float(step_ns.sum()) / 1e9 if step_ns.size else 0.0
        copies = (t["kind"] == "copy") if len(t["kind"]) else np.zeros(0, bool)
        copy_ns = t["ns"][copies] if len(t["kind"]) else np.zeros(0)
        copy_bytes = t["bytes"][copies] if len(t["kind"]) else np.zeros(0)
        return {
            "policy": self.config.policy, "contract": self.config.contract, "scope": self.config.scope,
            "batch": self.config.batch, "offload": self.offload,
            "capacity_total": int(sum(x.capacity for x in self.per_layer)) if self.config.scope == "per-layer"
            else self.memory.get("capacity_total"),
            "transferred": self.transferred, "hits": self.hits,
            "prefill_misses": int(sum(x.prefill_misses for x in self.per_layer)),
            "decode_misses": int(sum(x.decode_misses for x in self.per_layer)),
            "prefill_hits": int(sum(x.prefill_hits for x in self.per_layer)),
            "decode_hits": int(sum(x.decode_hits for x in self.per_layer)),
            "initial_load": int(sum(x.initial_load for x in self.per_layer)),
            "transfers_copied": self.transfers_copied,
            "n_requests": len(self.request_ids), "n_forwards": self.n_forwards,
            "n_decode_steps": self.n_decode_steps, "decode_tokens": n_dec_tokens,
            "wall_seconds": self.wall_seconds,
            "decode_step_ms_mean": float(step_ns.mean()) / 1e6 if step_ns.size else None,
            "decode_step_ms_median": float(np.median(step_ns)) / 1e6 if step_ns.size else None,
            "decode_tokens_per_s": n_dec_tokens / decode_s if decode_s > 0 else None,
            "copy_seconds": float(copy_ns.sum()) / 1e9 if copy_ns.size else 0.0,
            "copy_gb_per_s": (float(copy_bytes.sum()) / float(copy_ns.sum())) if copy_ns.size and copy_ns.sum() else None,
            **{f"memory_{k}": v for k, v in self.memory.items() if not isinstance(v, list)},
        }


def units_of_stream(stream: EventStream, contract: str) -> list[tuple[int, tuple[int, ...]]]:
    """The controller units of ``stream`` under ``contract``: ``(layer, blocks)`` per unit, in order."""
    N = stream.n_experts
    units: list[tuple[int, tuple[int, ...]]] = []
    for i in range(stream.n_events):
        layer = int(stream.layer[i])
        blocks = tuple(layer * N + int(e) for e in sorted(stream.members(i).tolist()))
        if contract == "fused":
            units.append((layer, blocks))
        else:
            units.extend((layer, (b,)) for b in blocks)
    return units


def _next_use_table(units: list[tuple[int, tuple[int, ...]]]) -> dict[tuple[int, int], int]:
    """``(unit, block) -> next unit holding block`` (``NEVER`` if none), by a backward scan."""
    table: dict[tuple[int, int], int] = {}
    seen: dict[int, int] = {}
    for t in range(len(units) - 1, -1, -1):
        for b in units[t][1]:
            table[(t, b)] = seen.get(b, NEVER)
            seen[b] = t
    return table


class _Accumulator:
    """Expert-by-expert outputs reduced as the model's implementation reduces them.

    ``per_slot`` (grouped_mm / batched_mm): each (token, slot) output is kept and the slots are
    summed per token at the end (``view(T, k, H).sum(1)``); eager: ``index_add_`` per expert in call
    order, over the rows in the order ``torch.where`` gives the eager loop (slot-major).
    """

    def __init__(self, hidden: torch.Tensor, index: torch.Tensor, per_slot: bool) -> None:
        self.hidden, self.index, self.per_slot = hidden, index, per_slot
        T, k = index.shape
        self.buf = (torch.zeros((T, k, hidden.shape[-1]), dtype=hidden.dtype, device=hidden.device) if per_slot
                    else torch.zeros_like(hidden))

    def add(self, expert: int, slot: int, call_own, tensors, n_slots: int, weights: torch.Tensor) -> None:
        """Compute ``expert``'s tokens from ``slot`` with the model's own forward and accumulate them."""
        index = self.index
        if self.per_slot:
            tok, pos = torch.where(index == expert)
        else:
            pos, tok = torch.where(index.T == expert)
        one = torch.full((tok.shape[0], 1), slot, dtype=index.dtype, device=index.device)
        y = call_own(tensors, n_slots, self.hidden[tok], one, weights[tok, pos][:, None])
        if self.per_slot:
            self.buf[tok, pos] = y
        else:
            self.buf.index_add_(0, tok, y.to(self.buf.dtype))

    def result(self) -> torch.Tensor:
        return self.buf.sum(dim=1).to(self.hidden.dtype) if self.per_slot else self.buf


def process_memory() -> dict[str, int]:
    """This process's memory from ``/proc/self/status`` (Linux; empty elsewhere), in bytes.

    ``process_peak_rss_bytes`` (VmHWM) counts every resident page, including pages of the mapped
    checkpoint the run touched; ``process_rss_anon_bytes`` (RssAnon) is the memory the kernel cannot
    drop — with ``--host-tier mmap`` it excludes the expert weights, whose file pages are reclaimable
    page cache (``process_rss_file_bytes``, RssFile) re-read from the file when evicted.
    """
    fields = {"VmHWM": "process_peak_rss_bytes", "RssAnon": "process_rss_anon_bytes",
              "RssFile": "process_rss_file_bytes"}
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in fields:
                    out[fields[key]] = int(value.split()[0]) * 1024
    except OSError:
        return {}
    return out


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None and tokenizer is not None:
        eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return []
    return sorted({int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])})


class Executor:
    """Runs a loaded model with its experts offloaded (or, ``offload=False``, unmodified).

    Parameters
    ----------
    model
        A transformers MoE causal LM of a supported architecture, on CPU (the executor moves the
        non-expert weights to ``config.device``).
    config
        :class:`~expertcache.execute.config.ExecuteConfig`.
    eos_token_ids
        Tokens that end a request (default: the model's generation config).
    calibration
        ``static``: the stream the pin list is fitted on (most union accesses per partition).
    advice_stream
        ``belady`` / ``belady-forced``: the executed stream of an earlier recording of the same
        prompts at the same ``B`` (:func:`~expertcache.execute.stream.executed_stream`); the run must
        repeat it unit for unit, else it stops with an error.
    advice
        ``predicted-next-use``: an :class:`expertcache.nextuse.Advice` aligned to this run's stream.
    offload
        ``False``: the reference run of the unmodified model (no tiers, no controller).
    keep_logits
        Keep every forward's logits (tests compare them bit for bit).
    host
        ``--host-tier mmap``: the mapped host tier of
        :func:`~expertcache.execute.checkpoint.load_offloaded`, whose ``model`` has its expert
        parameters on ``meta``; default: the loaded expert weights become the host tier (a CPU copy).
    clock
        CPU span clock of the timings (:data:`~expertcache.execute.timings.CLOCKS`): ``"wall"`` (default)
        or ``"cpu"`` (the thread's CPU time); CUDA spans are CUDA events either way.
    """

    def __init__(self, model: Any, config: ExecuteConfig, *, eos_token_ids: Sequence[int] | None = None,
                 calibration: EventStream | None = None, advice_stream: EventStream | None = None,
                 advice: Any = None, offload: bool = True, keep_logits: bool = False,
                 host: HostTier | None = None, clock: str = "wall") -> None:
        self.model = model
        self.clock = clock
        self.config = config
        self.offload = offload
        self.keep_logits = keep_logits
        hf = model.config
        self.adapter = adapter_for(hf)
        self.layers = find_moe_layers(model, self.adapter)
        self.L = len(self.layers)
        self.N = self.adapter.n_experts(hf)
        self.k = self.adapter.top_k(hf)
        self.eos = list(eos_token_ids) if eos_token_ids is not None else _eos_ids(model, None)
        self.device = torch.device(config.device)
        self.dtype = next(model.parameters()).dtype
        self.calibration = calibration
        self.advice_stream = advice_stream
        self.advice = advice
        self.patches: list[PatchedExperts] = []
        self.host: HostTier | None = host
        self.mapped = host is not None
        self.tier: DeviceTier | None = None
        if config.experts_implementation is not None and hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation(config.experts_implementation)
        self._impl = getattr(hf, "_experts_implementation", None) or "eager"
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        if offload:
            self.names = [expert_parameters(layer.experts, self.N) for layer in self.layers]

    # ------------------------------------------------------------------ set-up
    def _setup(self, max_unit: int) -> None:
        cfg = self.config
        L, N = self.L, self.N
        self.caps = cfg.capacities(L, N)
        policy_caps = [0] * len(self.caps) if cfg.policy == "demand" else self.caps
        universe = L * N if cfg.scope == "global" else N
        self.slots = [min(universe, c + max_unit) if cfg.policy != "static" else min(universe, min(c, universe)
                      + max_unit) for c in policy_caps]
        tie = tie_ranks(cfg.tie_break, cfg.seed, L * N)
        pinned = None
        if cfg.policy == "static":
            if self.calibration is None:
                raise ValidationError("policy 'static' needs a calibration trace or stream (--calibration)",
                                      field="calibration")
            if (self.calibration.n_layers, self.calibration.n_experts) != (L, N):
                raise ValidationError(f"the calibration stream has L={self.calibration.n_layers}, "
                                      f"N={self.calibration.n_experts}; the model has L={L}, N={N}",
                                      field="calibration")
            counts = np.bincount(self.calibration.block, minlength=L * N)
            pinned = pinned_blocks(counts, self.caps, L, N, cfg.scope, tie)
        next_use: Callable[[int, int], int] | None = None
        self._expected: list[tuple[int, tuple[int, ...]]] | None = None
        if cfg.policy in ("belady", "belady-forced"):
            if self.advice_stream is None:
                raise ValidationError(f"policy {cfg.policy!r} needs an earlier recording of the same prompts "
                                      "(--advice-from RUN_OR_TRACE) to know next uses", field="advice")
            self._expected = units_of_stream(self.advice_stream, cfg.contract)
            table = _next_use_table(self._expected)
            next_use = lambda t, b: table[(t, b)]  # noqa: E731
        elif cfg.policy == "predicted-next-use":
            if self.advice is None or getattr(self.advice, "next_use", None) is None:
                raise ValidationError("policy 'predicted-next-use' needs next-use advice (--advice FILE)",
                                      field="advice")
            adv = np.asarray(self.advice.next_use)
            self._unit_base: list[int] = []
            self._unit_blocks: list[tuple[int, ...]] = []

            def next_use(t: int, b: int) -> int:
                a = self._unit_base[t] + self._unit_blocks[t].index(b)
                if a >= adv.shape[0]:
                    raise ValidationError(f"the advice covers {adv.shape[0]} accesses; the run has more",
                                          field="advice")
                return int(adv[a])
        self.controller = CacheController(cfg.policy, L, N, self.caps, cfg.scope, tie, lrfu_lambda=cfg.lrfu_lambda,
                                          pinned=pinned, next_use=next_use)
        # tiers: host (pinned on CUDA, or the mapped checkpoint) and device slots
        cuda = self.device.type == "cuda"
        if self.mapped:
            assert self.host is not None
            like = self.host.like()
        else:
            stacked = [{n: getattr(layer.experts, n).detach().to("cpu") for n in names}
                       for layer, names in zip(self.layers, self.names, strict=True)]
            self.host = HostTier.from_stacked([{n: (t.pin_memory() if cuda else t) for n, t in d.items()}
                                               for d in stacked], "pinned" if cuda else "ram")
            like = {n: t[0] for n, t in stacked[0].items()}
            del stacked
        for li, layer in enumerate(self.layers):
            patch = PatchedExperts(layer.experts, self.names[li], self._handler(li))
            patch.detach_weights()
            if self.mapped:
                patch.original = {}      # the file is the host tier; the module's experts were never loaded
            self.patches.append(patch)
        self.model.to(self.device)
        self.tier = DeviceTier(like, self.slots, self.device, self.dtype)
        self.non_blocking = cuda
        self.luts = [torch.zeros(N, dtype=torch.long) for _ in range(L)]

    def restore(self) -> None:
        """Undo the patching (the experts get their original parameters back)."""
        for p in self.patches:
            p.restore()
        self.patches.clear()

    # ------------------------------------------------------------- the MoE layer
    def _load(self, layer: int, block: int, part: int) -> int:
        assert self.host is not None and self.tier is not None
        token = self.timer.begin()
        slot = self.tier.load(part, block, self.host.block(layer, block % self.N), self.non_blocking)
        self.timer.end(token, "copy", self._forward, self._phase, layer, block % self.N, self.host.block_bytes)
        self.copies += 1
        return slot

    def _count(self, layer: int, hits: int, misses: int) -> None:
        ph = self._phase
        self.counts[layer, 2 * ph] += hits
        self.counts[layer, 2 * ph + 1] += misses
        self._ev_hits += hits
        self._ev_misses += misses

    def _check_expected(self, layer: int, blocks: tuple[int, ...]) -> None:
        t = self.controller.t
        if self._expected is not None:
            if t >= len(self._expected) or self._expected[t] != (layer, blocks):
                raise ValidationError(f"the run diverged from the advice recording at unit {t} (layer {layer}); "
                                      "record the advice with the same model, prompts, batch and offsets",
                                      field="advice")
        if self.config.policy == "predicted-next-use":
            base = (self._unit_base[-1] + len(self._unit_blocks[-1])) if self._unit_base else 0
            self._unit_base.append(base)
            self._unit_blocks.append(blocks)

    def _retain(self, layer: int, part: int, blocks: tuple[int, ...]) -> None:
        assert self.tier is not None
        out = self.controller.retain(layer, self._forward, blocks)
        for b in out.evicted | out.bypassed:
            self.tier.release(part, b)

    def _handler(self, li: int) -> Callable[..., torch.Tensor]:
        def handler(hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, call_own) -> torch.Tensor:
            assert self.tier is not None
            token = self.timer.begin()
            N = self.N
            part = self.controller.partition(li)
            experts = sorted(set(index.reshape(-1).tolist()))
            self._ev_hits = self._ev_misses = 0
            tensors = self.tier.expert_tensors(part)
            n_slots = self.tier.slots[part]
            lut = self.luts[li]
            per_slot = self._impl != "eager"
            if self.config.contract == "fused":
                blocks = tuple(li * N + e for e in experts)
                self._check_expected(li, blocks)
                hits, misses = self.controller.classify(li, blocks)
                in_use = self.tier.slots[part] - len(self.tier.free[part])
                self.tier.reserve(part, in_use + len(misses))
                tensors = self.tier.expert_tensors(part)
                n_slots = self.tier.slots[part]
                for b in misses:
                    self._load(li, b, part)
                slot_of = self.tier.slot_of[part]
                if per_slot:        # one call of the model's own kernel on remapped slot ids
                    for b in blocks:
                        lut[b - li * N] = slot_of[b]
                    out = call_own(tensors, n_slots, hidden, lut.to(index.device)[index], weights)
                else:               # eager: the model's own loop, expert by expert in ascending id
                    acc = _Accumulator(hidden, index, per_slot)
                    for e in experts:
                        acc.add(e, slot_of[li * N + e], call_own, tensors, n_slots, weights)
                    out = acc.result()
                self._count(li, len(hits), len(misses))
                self._retain(li, part, blocks)
            else:
                acc = _Accumulator(hidden, index, per_slot)
                for e in experts:
                    b = li * N + e
                    self._check_expected(li, (b,))
                    hits, misses = self.controller.classify(li, (b,))
                    if misses:
                        self._load(li, b, part)
                    acc.add(e, self.tier.slot_of[part][b], call_own, tensors, n_slots, weights)
                    self._count(li, len(hits), len(misses))
                    self._retain(li, part, (b,))
                out = acc.result()
            self.event_log.append((self._forward, li, self._phase, self._ev_hits, self._ev_misses))
            self.timer.end(token, "layer", self._forward, self._phase, li)
            return out

        return handler

    # ------------------------------------------------------------------ the run
    def _forward_model(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                       position_ids: torch.Tensor | None, cache: Any) -> torch.Tensor:
        kwargs = {self._cache_kw: cache, "use_cache": True}
        with torch.no_grad():
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        return out.logits

    def run(self, prompts: Sequence[Sequence[int]], request_ids: Sequence[str],
            progress: Callable[[int, int], None] | None = None) -> ExecutionResult:
        """Execute every prompt (token ids) under FCFS continuous batching; see the module docstring."""
        from transformers import DynamicCache

        cfg = self.config
        n_req = len(prompts)
        if n_req == 0:
            raise ValidationError("no prompts to execute", field="prompts")
        # the workspace starts at what a decode event can need (B*k distinct experts) and grows when a
        # prefill needs more at once (DeviceTier.reserve); serialized units need one block
        max_unit = min(self.N, self.k * cfg.batch) if cfg.contract == "fused" else 1
        self.timer = SpanTimer(self.device, self.clock)
        self.counts = np.zeros((self.L, 4), dtype=np.int64)
        self.event_log: list[tuple[int, int, int, int, int]] = []
        self.copies = 0
        self._forward = 0
        self._phase = 0
        initial = [0] * self.L
        if self.offload:
            self._setup(max_unit)
            # static: the pin list is loaded before the first unit (counted as initial load)
            if cfg.policy == "static":
                for part, blocks in enumerate(self.controller.cache):
                    for b in sorted(blocks):
                        self._load(b // self.N, b, part)
                initial = self.controller.initial_load()
        else:
            self.model.to(self.device)
        arrivals = cfg.offsets.arrivals(n_req)
        sched = FcfsScheduler(arrivals, cfg.batch)
        eos = set(self.eos)
        generated: list[list[int]] = [[] for _ in range(n_req)]
        stop = ["" for _ in range(n_req)]
        kv: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}   # request -> per-layer (k, v), unpadded
        routes: list[list[list[tuple]]] = [[[] for _ in range(self.L)] for _ in range(n_req)]
        logits_kept: list[torch.Tensor] = []
        batch_rows: tuple[int, ...] = ()
        batch_cache = None
        batch_len: dict[int, int] = {}
        n_dec_steps = 0
        done_requests = 0
        t_start = time.perf_counter()
        recorder = RouterRecorder(self.layers)

        def take_routes(rows_of: list[tuple[int, int, int]]) -> None:
            # rows_of: (request, first row in this forward's flattened tokens, count)
            for li, calls in enumerate(recorder.calls):
                logits, w, idx, _ = calls[-1]
                for r, lo, n in rows_of:
                    routes[r][li].append((logits[lo:lo + n], w[lo:lo + n], idx[lo:lo + n]))
                calls.clear()

        def finish(r: int, why: str) -> None:
            nonlocal done_requests
            stop[r] = why
            done_requests += 1
            if progress:
                progress(done_requests, n_req)

        with recorder:
            while not sched.done:
                while (r := sched.admit_next()) is not None:
                    # prefill forward of r alone
                    self._phase = 0
                    ids = torch.tensor([list(prompts[r])], dtype=torch.long, device=self.device)
                    cache = DynamicCache()
                    token = self.timer.begin()
                    logits = self._forward_model(ids, None, None, cache)
                    self.timer.end(token, "forward", self._forward, 0)
                    self._forward += 1
                    take_routes([(r, 0, ids.shape[1])])
                    if self.keep_logits:
                        logits_kept.append(logits[0].float().cpu().clone())
                    g0 = int(logits[0, -1].argmax())
                    generated[r].append(g0)
                    kv[r] = [(lay.keys, lay.values) for lay in cache.layers]
                    if g0 in eos or cfg.max_new_tokens == 0:
                        finish(r, "eos" if g0 in eos else "length")
                        kv.pop(r)
                    else:
                        sched.start(r)
                fwd = sched.decode_forward()
                if fwd is None:
                    sched.step += 1
                    continue
                self._phase = 1
                rows = fwd.requests
                if rows != batch_rows:
                    batch_cache, batch_len = self._rebuild(rows, batch_rows, batch_cache, batch_len, kv)
                    batch_rows = rows
                T = max(batch_len.values())
                mask = torch.zeros((len(rows), T + 1), dtype=torch.long)
                for i, r in enumerate(rows):
                    mask[i, T - batch_len[r]:] = 1
                ids = torch.tensor([[generated[r][-1]] for r in rows], dtype=torch.long, device=self.device)
                pos = torch.tensor([[batch_len[r]] for r in rows], dtype=torch.long, device=self.device)
                token = self.timer.begin()
                logits = self._forward_model(ids, mask.to(self.device), pos, batch_cache)
                self.timer.end(token, "forward", self._forward, 1)
                self._forward += 1
                n_dec_steps += 1
                take_routes([(r, i, 1) for i, r in enumerate(rows)])
                if self.keep_logits:
                    logits_kept.append(logits[:, -1].float().cpu().clone())
                nxt = logits[:, -1].argmax(-1).tolist()
                finished = []
                for i, r in enumerate(rows):
                    batch_len[r] += 1
                    g = int(nxt[i])
                    generated[r].append(g)
                    if g in eos or len(generated[r]) - 1 >= cfg.max_new_tokens:
                        finished.append(r)
                        finish(r, "eos" if g in eos else "length")
                sched.finish(finished)
                self.timer.flush()
        wall = time.perf_counter() - t_start
        trace = self._trace(prompts, request_ids, generated, stop, routes)
        def part(li: int) -> int:
            return self.controller.partition(li) if self.offload else 0

        per_layer = tuple(
            LayerPhaseCounts(li, int(self.caps[part(li)]) if self.offload else self.N,
                             int(self.tier.slots[part(li)]) if self.offload else self.N,
                             int(self.counts[li, 0]), int(self.counts[li, 1]), int(self.counts[li, 2]),
                             int(self.counts[li, 3]), int(initial[li]))
            for li in range(self.L))
        memory = self._memory()
        return ExecutionResult(cfg, self.offload, tuple(request_ids), generated, stop, trace, per_layer,
                               np.array(self.event_log, dtype=np.int64).reshape(-1, 5), self.copies, memory,
                               self.timer.columns(), wall, self._forward, n_dec_steps, logits_kept)

    def _rebuild(self, rows: tuple[int, ...], old_rows: tuple[int, ...], old_cache: Any,
                 old_len: dict[int, int], kv: dict[int, list]) -> tuple[Any, dict[int, int]]:
        """A left-padded batch cache over ``rows`` (requests still in the old batch keep their KV)."""
        from transformers import DynamicCache

        per_req: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        lens: dict[int, int] = {}
        if old_cache is not None:
            T_old = max(old_len.values())
            for i, r in enumerate(old_rows):
                if r in rows:
                    n = old_len[r]
                    per_req[r] = [(lay.keys[i:i + 1, :, T_old - n:], lay.values[i:i + 1, :, T_old - n:])
                                  for lay in old_cache.layers]
                    lens[r] = n
        for r in rows:
            if r not in per_req:
                per_req[r] = kv.pop(r)
                lens[r] = per_req[r][0][0].shape[2]
        T = max(lens.values())
        data = []
        for li in range(len(per_req[rows[0]])):
            k0, v0 = per_req[rows[0]][li]
            K = torch.zeros((len(rows), k0.shape[1], T, k0.shape[3]), dtype=k0.dtype, device=k0.device)
            V = torch.zeros((len(rows), v0.shape[1], T, v0.shape[3]), dtype=v0.dtype, device=v0.device)
            for i, r in enumerate(rows):
                k, v = per_req[r][li]
                n = lens[r]
                K[i, :, T - n:] = k[0]
                V[i, :, T - n:] = v[0]
            data.append((K, V))
        return DynamicCache(ddp_cache_data=data), lens

    def _memory(self) -> dict[str, Any]:
        if not self.offload or self.tier is None or self.host is None:
            dev = sum(p.numel() * p.element_size() for p in self.model.parameters())
            return {"device_bytes_model": int(dev)}
        non_expert = sum(p.numel() * p.element_size() for p in self.model.parameters())
        block = self.host.block_bytes
        return {"block_bytes": block, "capacity_per_partition": list(self.caps),
                "slots_per_partition": list(self.tier.slots),
                "workspace_per_partition": [s - min(c, s) for s, c in zip(self.tier.slots, self.caps, strict=True)],
                "slots_high_water": list(self.tier.high_water),
                "device_expert_bytes": self.tier.nbytes,
                "device_expert_bytes_expected": int(sum(self.tier.slots)) * block,
                "device_non_expert_bytes": int(non_expert),
                "host_tier": self.host.kind, "host_expert_bytes": self.host.nbytes,
                "slots_total": int(sum(self.tier.slots)), "slots_high_water_total": int(sum(self.tier.high_water)),
                "capacity_total": int(sum(self.caps)), **process_memory()}

    def _trace(self, prompts, request_ids, generated, stop, routes) -> RoutingTrace:
        L, k = self.L, self.k
        ex, gt, pr, en, mg, tok, req, phase, position = [], [], [], [], [], [], [], [], []
        requests = {}
        for r in range(len(prompts)):
            P = len(prompts[r])
            D = len(generated[r]) - 1   # generated[r] = g_0..g_D; decode rows forward g_0..g_{D-1}
            layers_logits = [torch.cat([c[0] for c in routes[r][li]]) for li in range(L)]
            layers_w = [torch.cat([c[1] for c in routes[r][li]]) for li in range(L)]
            layers_i = [torch.cat([c[2] for c in routes[r][li]]) for li in range(L)]
            n = layers_i[0].shape[0]
            if n != P + D:
                raise RuntimeError(f"request {r}: {n} routed rows, expected {P} + {D}")
            st = [router_stats(layers_logits[li], layers_i[li], self.adapter.score) for li in range(L)]
            ex.append(torch.stack(layers_i, 1).to(torch.int16).cpu().numpy())
            gt.append(torch.stack(layers_w, 1).float().cpu().numpy())
            pr.append(torch.stack([s.probs for s in st], 1).float().cpu().numpy())
            en.append(torch.stack([s.entropy for s in st], 1).float().cpu().numpy())
            mg.append(torch.stack([s.margin for s in st], 1).float().cpu().numpy())
            tok.append(np.r_[np.asarray(prompts[r], np.int64), np.asarray(generated[r][:D], np.int64)])
            req.append(np.full(P + D, r, np.int32))
            phase.append(np.r_[np.zeros(P, np.int8), np.ones(D, np.int8)])
            position.append(np.arange(P + D, dtype=np.int32))
            requests[request_ids[r]] = {"prompt_tokens": P, "decode_tokens": D, "stop": stop[r]}
        prov = {"generator": "expertcache execute", "model_type": self.model.config.model_type,
                "moe_layers": [lay.decoder_layer for lay in self.layers], "requests": requests,
                "execution": self.config.to_dict(), "offload": self.offload,
                "eos_token_ids": self.eos, "expert_block_bytes": self.host.block_bytes if self.host else None,
                "router_score": self.adapter.score, "router_class": self.adapter.router_class,
                "dtype": str(self.dtype).removeprefix("torch."),
                "decode_semantics": "decode row j = forward of generated token j at position prompt_len + j; "
                                    "EOS is not forwarded; at most max_new_tokens decode rows"}
        return RoutingTrace(L, self.N, k, tuple(request_ids), np.concatenate(req), np.concatenate(phase),
                            np.concatenate(position), np.concatenate(ex), np.concatenate(gt), np.concatenate(tok),
                            prov, np.concatenate(pr), np.concatenate(en), np.concatenate(mg))
