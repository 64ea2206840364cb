"""expertcache replay throughput against libCacheSim on a Qwen3-30B-A3B-shaped stream, alternated.

    python benchmarks/bench_vs_libcachesim.py [--steps 5200 | --quick] [--pairs 7] [--rho 0.1,0.4,0.75]
        [--all-policies] [--json [PATH]]

Needs ``pip install libcachesim==0.3.5`` next to expertcache.

What it does (see benchmarks/README.md for the full description):

1. Builds a stream of 48 layers x 128 experts, top-8, B = 8 (skewed per-layer
   popularity that drifts slowly), about 10 M union accesses at the default
   5,200 steps, and writes its flattened per-layer (and global) request
   streams as libCacheSim oracleGeneral binary traces.
2. Headline, at every ``--rho``: event-atomic per-layer ``lru`` against
   libCacheSim LRU, and event-atomic per-layer ``belady`` (its preparation,
   event bitsets or a next-use pass, is inside ``replay()``) against libCacheSim Belady *including* its oracle
   (next-access vtime computed from the numpy arrays). After one untimed
   warm-up of each side, the two sides alternate pair by pair (ours, theirs,
   ours, theirs, ... ``--pairs`` times) on the same accesses and capacities;
   each pair gives one ratio (ours M acc/s / theirs M req/s) and the table
   prints the min and median of those ratios, so that load drift on a shared
   machine moves both sides of a pair alike.
3. Cross-checks miss counts where the semantics coincide (sequential ``lru``
   == LRU and ``belady-forced`` == Belady, layer by layer, per-layer scope),
   at every rho; the script exits non-zero if an "equal" expectation fails.
4. ``--all-policies`` adds, at the first rho, the former every-policy table:
   every registered policy x {event-atomic, sequential-ascending} x
   {per-layer, global} (best of ``--repeat``, not alternated), libCacheSim
   LRU, LFU and Belady per layer and global, and their cross-checks.
5. Memory figures and the JIT compile / cache-load cost (two subprocesses
   sharing a fresh ``NUMBA_CACHE_DIR``; ``--no-jit-probe`` skips them).

With a bare ``--json`` stdout carries exactly one JSON object with every
figure (``--json PATH`` writes it to PATH and still prints the tables);
progress lines always go to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ab import machine  # noqa: E402

from expertcache.events import EventStream  # noqa: E402
from expertcache.replay import ReplayConfig, get_policy, policy_names, replay  # noqa: E402
from expertcache.replay.libcachesim import next_access_vtime, write_oracle_general  # noqa: E402

# Shape of the benchmark (Qwen3-30B-A3B decode at B = 8) and the replay setting.
N_LAYERS, N_EXPERTS, TOP_K, BATCH = 48, 128, 8, 8
RHOS = (0.1, 0.4, 0.75)  # the headline is 0.4; 0.1 and 0.75 show the regime dependence
PAIRS = 7
STEPS_FULL = 5200  # ~10.0 M union accesses (mean |E| ~ 40.2 per event)
STEPS_QUICK = 520  # ~1.0 M union accesses
SEMANTICS = ("event-atomic", "sequential-ascending")
SCOPES = ("per-layer", "global")
LCS_POLICIES = ("LRU", "LFU", "Belady")



def log(msg: str) -> None:
    """Progress line on stderr (stdout is reserved for the table or the JSON object)."""
    print(msg, file=sys.stderr, flush=True)


def maxrss_mib() -> float:
    """Peak resident set size of this process so far, MiB (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ---------------------------------------------------------------------------------------- stream
def drifting_qwen_stream(steps: int, sample_seed: int, structure_seed: int = 0, alpha: float = 0.9,
                         drift_every: int = 250, drift_window: int = 16, chunk: int = 50) -> EventStream:
    """A Qwen3-30B-A3B-shaped decode stream with skewed, slowly drifting routing.

    The distribution of ``qwen_shaped_stream`` in ``benchmarks/replay_throughput.py``
    (per layer, a Zipf(``alpha``) popularity over a random ranking of the
    experts; each of the B requests draws k distinct experts by Gumbel top-k),
    vectorised over ``chunk`` steps at a time (small, so that building the
    stream does not set the process's peak memory), plus drift: before each
    block of ``drift_every`` steps after the first, every layer's ranking has a
    random window of ``drift_window`` consecutive ranks rotated by one place.

    ``structure_seed`` fixes the initial rankings (the "model"); ``sample_seed``
    the draws and the drift (the "traffic"). A calibration stream shares the
    structure seed and uses another sample seed. Everything is deterministic.
    """
    L, N, k, B = N_LAYERS, N_EXPERTS, TOP_K, BATCH
    perm = np.stack([np.random.default_rng([structure_seed, l]).permutation(N) for l in range(L)])
    rng = np.random.default_rng(sample_seed)
    logw = -alpha * np.log(np.arange(1, N + 1, dtype=np.float64))
    experts, mult, sizes = [], [], []
    s0 = 0
    while s0 < steps:
        if s0 and s0 % drift_every == 0:
            for l in range(L):
                r = int(rng.integers(0, N - drift_window + 1))
                perm[l, r:r + drift_window] = np.roll(perm[l, r:r + drift_window], 1)
        S = min(chunk, steps - s0, drift_every - s0 % drift_every)  # never straddles a drift boundary
        s0 += S
        z = logw + rng.gumbel(size=(S, L, B, N))
        ranks = np.argpartition(-z, k - 1, axis=-1)[..., :k]
        picks = np.take_along_axis(np.broadcast_to(perm[None, :, None, :], (S, L, B, N)), ranks, axis=-1)
        event = np.arange(S * L).reshape(S, L, 1, 1)
        counts = np.bincount((event * N + picks).ravel(), minlength=S * L * N).reshape(S * L, N)
        rows, cols = np.nonzero(counts)  # row-major: events in (step, layer) order, experts ascending
        experts.append(cols.astype(np.int16))
        mult.append(counts[rows, cols].astype(np.int32))
        sizes.append(np.count_nonzero(counts, axis=1))
    size = np.concatenate(sizes)
    offsets = np.zeros(size.shape[0] + 1, dtype=np.int64)
    np.cumsum(size, out=offsets[1:])
    active = np.full(size.shape[0], B, dtype=np.int32)
    return EventStream(
        L, N, k,
        np.repeat(np.arange(steps, dtype=np.int64), L), np.tile(np.arange(L, dtype=np.int32), steps),
        active, active.astype(np.int64) * k, offsets, np.concatenate(experts), np.concatenate(mult), None,
        {"generator": "benchmarks/bench_vs_libcachesim.py:drifting_qwen_stream", "steps": steps,
         "sample_seed": sample_seed, "structure_seed": structure_seed, "alpha": alpha,
         "drift_every": drift_every, "drift_window": drift_window, "chunk": chunk},
    )


def stream_prefix(stream: EventStream, steps: int) -> EventStream:
    """The events of the first ``steps`` scheduling steps of ``stream`` (a valid stream)."""
    n = int(np.searchsorted(stream.step, stream.step[0] + steps, side="left"))
    a = int(stream.offsets[n])
    gm = None if stream.gate_mass is None else stream.gate_mass[:a]
    return EventStream(stream.n_layers, stream.n_experts, stream.top_k, stream.step[:n], stream.layer[:n],
                       stream.active[:n], stream.logical_per_event[:n], stream.offsets[:n + 1],
                       stream.expert[:a], stream.multiplicity[:a], gm, dict(stream.provenance))


def stream_nbytes(stream: EventStream) -> int:
    """Bytes held by the stream's arrays (what stays resident per union access)."""
    arrays = [stream.step, stream.layer, stream.active, stream.logical_per_event, stream.offsets,
              stream.expert, stream.multiplicity]
    if stream.gate_mass is not None:
        arrays.append(stream.gate_mass)
    return int(sum(a.nbytes for a in arrays))


def per_layer_capacities(rho: float, n_layers: int, n_experts: int) -> tuple[int, list[int]]:
    """``total = floor(rho*L*N + 0.5)``; ``c_l = total // L``, plus one for the first ``total % L`` layers."""
    total = int(math.floor(rho * n_layers * n_experts + 0.5))
    return total, [total // n_layers + (1 if l < total % n_layers else 0) for l in range(n_layers)]


# ------------------------------------------------------------------------------------ expertcache
@dataclass
class OursRow:
    """One timed expertcache replay."""

    policy: str
    semantics: str
    scope: str
    union: int
    seconds: float
    demand_misses: int
    miss_fraction: float
    prefix_steps: int | None = None  # set when only a prefix was timed (see --max-config-seconds)
    lfu_in_cache_counters: bool = False
    per_layer_misses: list[int] = field(default_factory=list, repr=False)

    @property
    def label(self) -> str:
        """Policy name, marked when the LFU counters are the in-cache variant."""
        return self.policy + (" (in-cache counters)" if self.lfu_in_cache_counters else "")

    @property
    def m_acc_per_s(self) -> float:
        """Million union accesses per second."""
        return self.union / self.seconds / 1e6


def time_ours(stream: EventStream, calibration: EventStream, warm: EventStream, policies: list[str], rho: float,
              max_config_seconds: float, extra: list[tuple[str, str, str, bool]], repeat: int) -> list[OursRow]:
    """Time ``replay`` for every policy x semantics x scope, plus the ``extra`` configurations.

    Each configuration is replayed twice on ``warm`` (a short prefix): the
    first call pays the JIT compile or cache load, the second estimates the
    rate. If the estimated full run exceeds ``max_config_seconds``, a prefix of
    ``stream`` sized to fit is timed instead and the row says so. Otherwise,
    when the estimate is under a quarter of that limit, one untimed full-size
    replay comes first: a cold call may also pay the page faults of fresh
    temporaries (we saw up to 2x on sequential replay on a 2-core VM). The
    best of ``repeat`` timed replays is reported (prefix-timed ones run once).
    """
    configs = [(p, sem, scope, False) for p in policies for sem in SEMANTICS for scope in SCOPES] + extra
    steps_total = int(stream.step[-1] - stream.step[0] + 1)
    rows = []
    for policy, sem, scope, in_cache in configs:
        cfg = ReplayConfig(policy, rho=rho, scope=scope, semantics=sem, tie_break="random", seed=0,
                           lfu_in_cache_counters=in_cache)
        cal = calibration if get_policy(policy).needs_calibration else None
        replay(warm, cfg, cal)
        t0 = time.perf_counter()
        replay(warm, cfg, cal)
        est = (time.perf_counter() - t0) * stream.union / warm.union
        target, prefix, runs = stream, None, 1
        if est > max_config_seconds and get_policy(policy).kind != "static":  # static cost is the fit
            prefix = max(1, int(steps_total * max_config_seconds / est))
            target = stream_prefix(stream, prefix)
        elif est <= max_config_seconds / 4:
            replay(stream, cfg, cal)
            runs = repeat
        dt = math.inf
        for _ in range(runs):
            t0 = time.perf_counter()
            r = replay(target, cfg, cal)
            dt = min(dt, time.perf_counter() - t0)
        row = OursRow(policy, sem, scope, target.union, dt, r.demand_misses, r.miss_fraction, prefix, in_cache,
                      [lc.demand_misses for lc in r.per_layer])
        rows.append(row)
        note = f"  (prefix of {prefix} steps; full run est. {est:.0f} s)" if prefix else ""
        log(f"  ours {row.label:32s} {sem:21s} {scope:9s} {row.m_acc_per_s:7.2f} M acc/s  "
            f"miss {r.miss_fraction:.4f}{note}")
    return rows


# ------------------------------------------------------------------------------------- libCacheSim
@dataclass
class LcsTraces:
    """Flattened request streams written as libCacheSim oracleGeneral traces."""

    per_layer_paths: list[Path]
    per_layer_n: list[int]
    global_path: Path
    global_n: int
    flatten_s: float
    oracle_per_layer_s: float
    oracle_global_s: float
    write_s: float
    file_bytes: int
    layer_ids: list[np.ndarray] = field(default_factory=list, repr=False)  # what the oracle is computed from


def timed_best(fn: Any, repeat: int) -> tuple[float, Any]:
    """``(best seconds, result)`` of ``repeat`` calls of ``fn()`` after one untimed warm-up call.

    The warm-up matters for numpy work on 10 M elements: a cold call also pays
    the page faults of its fresh output arrays (3x on the global oracle here).
    """
    fn()
    best, out = math.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def build_lcs_traces(stream: EventStream, workdir: Path, repeat: int) -> LcsTraces:
    """Flatten ``stream`` per layer and globally, compute the Belady oracle, write the traces.

    Per layer: that layer's expert ids in event order, ascending within each
    event (exactly expertcache's sequential-ascending per-layer unit order).
    Global: block ids ``layer*N + expert`` in event order. Flattening and file
    writing are timed once; the oracle, which counts in Belady's headline, as
    the best of ``repeat`` after a warm-up, like the replays.
    """
    t0 = time.perf_counter()
    layer_of_access = np.repeat(stream.layer, stream.event_size)
    clock = np.repeat(stream.step, stream.event_size).astype(np.uint32)
    order = np.argsort(layer_of_access, kind="stable")
    bounds = np.cumsum(np.bincount(layer_of_access, minlength=stream.n_layers))[:-1]
    layer_ids = np.split(stream.expert[order], bounds)
    layer_clock = np.split(clock[order], bounds)
    gid_dtype = np.int16 if stream.n_blocks <= np.iinfo(np.int16).max else np.int32
    global_ids = (layer_of_access.astype(gid_dtype) * stream.n_experts + stream.expert).astype(gid_dtype)
    flatten_s = time.perf_counter() - t0

    oracle_per_layer_s, layer_next = timed_best(lambda: [next_access_vtime(ids) for ids in layer_ids], repeat)
    oracle_global_s, global_next = timed_best(lambda: next_access_vtime(global_ids), repeat)

    t0 = time.perf_counter()
    nbytes = 0
    paths = []
    for l, (ids, clk, nxt) in enumerate(zip(layer_ids, layer_clock, layer_next, strict=True)):
        paths.append(workdir / f"layer{l:02d}.oracleGeneral.bin")
        nbytes += write_oracle_general(paths[-1], ids, clk, nxt)
    gpath = workdir / "global.oracleGeneral.bin"
    nbytes += write_oracle_general(gpath, global_ids, clock, global_next)
    write_s = time.perf_counter() - t0
    return LcsTraces(paths, [int(a.shape[0]) for a in layer_ids], gpath, int(global_ids.shape[0]),
                     flatten_s, oracle_per_layer_s, oracle_global_s, write_s, nbytes, layer_ids)


def lcs_hashpower(n_objects: int) -> int:
    """Hash-table size exponent for a universe of ``n_objects`` (libCacheSim's default is 24)."""
    return max(8, int(n_objects).bit_length() + 1)


def run_lcs(policy: str, paths: list[Path], capacities: list[int], n_requests: list[int],
            hashpower: int | None) -> tuple[float, list[int]]:
    """Replay each trace through its own libCacheSim cache; return (total seconds, misses per trace).

    The timed region per trace covers opening the reader, creating the cache,
    ``process_trace`` and freeing the cache (freeing a cache with the default
    2^24-bucket hash table costs tens of milliseconds). Misses come from the
    returned object miss ratio, ``round(ratio * n)``, exact at these sizes.
    """
    import libcachesim as lcs

    cls = {"LRU": lcs.LRU, "LFU": lcs.LFU, "Belady": lcs.Belady}[policy]
    total, misses = 0.0, []
    for path, cap, n in zip(paths, capacities, n_requests, strict=True):
        hp = hashpower if hashpower is not None else 24
        t0 = time.perf_counter()
        reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
        cache = cls(cap, hashpower=hp)
        miss_ratio, _ = cache.process_trace(reader)
        del cache, reader  # never reader.close(): the pybind deleter closes it again (double free)
        total += time.perf_counter() - t0
        misses.append(int(round(miss_ratio * n)))
    return total, misses


@dataclass
class TheirsRow:
    """One timed libCacheSim configuration (all layers summed for per-layer scope)."""

    policy: str
    scope: str
    requests: int
    process_s: float
    oracle_s: float
    misses: int
    per_layer_misses: list[int] = field(default_factory=list, repr=False)

    @property
    def headline_s(self) -> float:
        """Processing time, plus the oracle preparation for Belady."""
        return self.process_s + self.oracle_s

    @property
    def m_req_per_s(self) -> float:
        """Million requests per second, headline time."""
        return self.requests / self.headline_s / 1e6


def time_theirs(traces: LcsTraces, caps: list[int], total: int, hashpower_auto: bool,
                repeat: int) -> list[TheirsRow]:
    """Time LRU, LFU and Belady per layer (summed) and on the global stream.

    One untimed warm-up run each, then the best of ``repeat`` timed runs.
    """
    rows = []
    for scope in SCOPES:
        if scope == "per-layer":
            paths, capacities, ns = traces.per_layer_paths, caps, traces.per_layer_n
            hp = lcs_hashpower(N_EXPERTS) if hashpower_auto else None
            oracle = traces.oracle_per_layer_s
        else:
            paths, capacities, ns = [traces.global_path], [total], [traces.global_n]
            hp = lcs_hashpower(N_LAYERS * N_EXPERTS) if hashpower_auto else None
            oracle = traces.oracle_global_s
        for policy in LCS_POLICIES:
            run_lcs(policy, paths, capacities, ns, hp)  # warm-up (page cache, allocator)
            secs, misses = min(run_lcs(policy, paths, capacities, ns, hp) for _ in range(repeat))
            row = TheirsRow(policy, scope, sum(ns), secs, oracle if policy == "Belady" else 0.0, sum(misses),
                            misses)
            rows.append(row)
            log(f"  libCacheSim {policy:7s} {scope:9s} {row.m_req_per_s:7.2f} M req/s  "
                f"(process {secs:.3f} s, oracle {row.oracle_s:.3f} s)  miss ratio {row.misses / row.requests:.4f}")
    return rows


# ------------------------------------------------------------------------------------- alternated
#: The headline comparisons: (our policy, libCacheSim policy); event-atomic, per-layer scope.
HEADLINE = (("lru", "LRU"), ("belady", "Belady"))
#: Per-layer miss-count cross-checks run at every rho: (our policy, semantics, theirs, expectation).
CHECKS = (("lru", "sequential-ascending", "LRU", "equal"), ("belady-forced", "sequential-ascending", "Belady", "equal"),
          ("belady", "sequential-ascending", "Belady", "ours<=theirs"))


def lcs_per_layer_headline(policy: str, traces: LcsTraces, caps: list[int], hashpower: int | None
                           ) -> tuple[float, float, list[int]]:
    """One libCacheSim per-layer run: ``(process seconds, oracle seconds, misses per layer)``.

    For Belady the oracle (next-access vtime of every layer's requests, what the
    trace files carry) is recomputed and timed in the same call, so that it sits
    inside the pair like our next-use pass sits inside ``replay()``.
    """
    oracle_s = 0.0
    if policy == "Belady":
        t0 = time.perf_counter()
        for ids in traces.layer_ids:
            next_access_vtime(ids)
        oracle_s = time.perf_counter() - t0
    secs, misses = run_lcs(policy, traces.per_layer_paths, caps, traces.per_layer_n, hashpower)
    return secs, oracle_s, misses


def alternate(stream: EventStream, warm: EventStream, traces: LcsTraces, rho: float, pairs: int,
              hashpower: int | None) -> list[dict[str, Any]]:
    """Time each headline comparison at ``rho`` as ``pairs`` alternated (ours, theirs) pairs.

    Both sides are warmed first (ours: the short ``warm`` prefix for the JIT,
    then one untimed full replay; theirs: one untimed full run). Each pair
    times one full replay of ours, then one full run of theirs, on the same
    accesses and capacities; its ratio is ours M acc/s over theirs M req/s.
    """
    _, caps = per_layer_capacities(rho, N_LAYERS, N_EXPERTS)
    out = []
    for policy, lcs_policy in HEADLINE:
        cfg = ReplayConfig(policy, rho=rho, scope="per-layer", semantics="event-atomic", tie_break="random", seed=0)
        replay(warm, cfg)
        replay(stream, cfg)
        lcs_per_layer_headline(lcs_policy, traces, caps, hashpower)
        ours_s, theirs_s, oracle_s, ratios = [], [], [], []
        misses = 0
        for _ in range(pairs):
            t0 = time.perf_counter()
            r = replay(stream, cfg)
            ours_s.append(time.perf_counter() - t0)
            proc, orc, _ = lcs_per_layer_headline(lcs_policy, traces, caps, hashpower)
            theirs_s.append(proc + orc)
            oracle_s.append(orc)
            ratios.append((stream.union / ours_s[-1]) / (sum(traces.per_layer_n) / theirs_s[-1]))
            misses = r.demand_misses
        row = {"rho": rho, "ours": f"{policy} event-atomic per-layer", "theirs": f"{lcs_policy} per-layer"
               + (" incl. oracle" if lcs_policy == "Belady" else ""), "pairs": pairs,
               "ours_s": ours_s, "theirs_s": theirs_s, "theirs_oracle_s": oracle_s, "ratios": ratios,
               "ratio_min": min(ratios), "ratio_median": statistics.median(ratios),
               "ours_m_acc_s_median": stream.union / statistics.median(ours_s) / 1e6,
               "theirs_m_req_s_median": sum(traces.per_layer_n) / statistics.median(theirs_s) / 1e6,
               "ours_miss_fraction": misses / stream.union}
        out.append(row)
        log(f"  rho {rho:<5g} {row['ours']:28s} vs {row['theirs']:25s} ratio min {row['ratio_min']:.2f} "
            f"median {row['ratio_median']:.2f}  (ours {row['ours_m_acc_s_median']:.1f} M acc/s, theirs "
            f"{row['theirs_m_req_s_median']:.1f} M req/s)")
    return out


def headline_checks(stream: EventStream, traces: LcsTraces, rho: float, hashpower: int | None
                    ) -> list[dict[str, Any]]:
    """Per-layer miss counts of the comparable pairs at ``rho`` (sequential-ascending = libCacheSim's order)."""
    _, caps = per_layer_capacities(rho, N_LAYERS, N_EXPERTS)
    theirs = {p: run_lcs(p, traces.per_layer_paths, caps, traces.per_layer_n, hashpower)[1] for p in ("LRU", "Belady")}
    out = []
    for policy, sem, lcs_policy, expect in CHECKS:
        r = replay(stream, ReplayConfig(policy, rho=rho, scope="per-layer", semantics=sem, tie_break="random", seed=0))
        o = [lc.demand_misses for lc in r.per_layer]
        t = theirs[lcs_policy]
        met = {"equal": o == t, "ours<=theirs": all(a <= b for a, b in zip(o, t, strict=True))}[expect]
        out.append({"rho": rho, "ours": policy, "theirs": lcs_policy, "scope": "per-layer", "semantics": sem,
                    "ours_misses": sum(o), "theirs_misses": sum(t), "difference": sum(o) - sum(t),
                    "layers_equal": sum(a == b for a, b in zip(o, t, strict=True)), "expect": expect,
                    "agrees": o == t, "expectation_met": met})
        log(f"  rho {rho:<5g} check {policy:13s} {sem} vs {lcs_policy:6s}: ours {sum(o):,} theirs {sum(t):,} "
            f"({'as expected' if met else 'NOT AS EXPECTED'}: {expect})")
    return out


# ----------------------------------------------------------------------------------------- JIT cost
_JIT_PROBE = """
import json, time
t0 = time.perf_counter()
from expertcache.events import EventStream
from expertcache.replay import ReplayConfig, get_policy, policy_names, replay
t1 = time.perf_counter()
s = EventStream.from_lists(2, 4, 2, steps=[0, 0, 1, 1, 2, 2], layers=[0, 1, 0, 1, 0, 1],
                           experts=[[0, 1], [2, 3], [1, 2], [0, 3], [0, 2], [1, 3]], active=[1] * 6)
def sweep():
    for p in policy_names(advice=False):
        cal = s if get_policy(p).needs_calibration else None
        for sem in ("event-atomic", "sequential-ascending", "sequential-random"):
            for scope in ("per-layer", "global"):
                replay(s, ReplayConfig(p, rho=0.5, scope=scope, semantics=sem), cal)
t2 = time.perf_counter(); sweep(); t3 = time.perf_counter(); sweep(); t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_sweep_s": t3 - t2, "second_sweep_s": t4 - t3}))
"""


def jit_costs() -> dict[str, Any]:
    """First-call cost in two fresh interpreters sharing a new, empty ``NUMBA_CACHE_DIR``.

    The first subprocess compiles every kernel and writes the cache; the
    second loads it. Each replays a tiny stream under every policy x semantics
    x scope twice: the first sweep pays compile / load, the second is the
    (negligible) steady cost.
    """
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache_dir:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
        for name in ("compile", "cache_load"):
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", _JIT_PROBE], env=env, capture_output=True, text=True,
                                  check=True, timeout=1800)
            rec = json.loads(proc.stdout.strip().splitlines()[-1])
            rec["process_wall_s"] = time.perf_counter() - t0
            rec["first_call_s"] = rec["first_sweep_s"] - rec["second_sweep_s"]
            out[name] = rec
            log(f"  JIT {name:10s}: first-call {rec['first_call_s']:.2f} s, import {rec['import_s']:.2f} s, "
                f"process {rec['process_wall_s']:.2f} s")
    return out


# ------------------------------------------------------------------------------------ cross-checks
def find(rows: list[OursRow], policy: str, sem: str, scope: str, in_cache: bool = False) -> OursRow | None:
    """The full-stream row of a configuration (``None`` if absent or only a prefix was timed)."""
    for r in rows:
        if (r.policy, r.semantics, r.scope, r.lfu_in_cache_counters) == (policy, sem, scope, in_cache):
            return r if r.prefix_steps is None else None
    return None


def cross_checks(ours: list[OursRow], theirs: list[TheirsRow]) -> list[dict[str, Any]]:
    """Miss counts of comparable pairs, sequential-ascending only (libCacheSim's order).

    ``expect`` says what the semantics predict: ``equal`` (same decision rule),
    ``ours<=theirs`` (our Belady may bypass; libCacheSim's always admits) or
    ``differs`` (different counters or tie conventions).
    """
    sem = "sequential-ascending"
    pairs = [("lru", False, "LRU", "equal"), ("belady-forced", False, "Belady", "equal"),
             ("belady", False, "Belady", "ours<=theirs"), ("lfu", False, "LFU", "differs"),
             ("lfu", True, "LFU", "differs")]
    out = []
    for scope in SCOPES:
        for policy, in_cache, lcs_policy, expect in pairs:
            o = find(ours, policy, sem, scope, in_cache)
            t = next((r for r in theirs if r.policy == lcs_policy and r.scope == scope), None)
            if o is None or t is None:
                continue
            layers_equal = (sum(a == b for a, b in zip(o.per_layer_misses, t.per_layer_misses, strict=True))
                            if scope == "per-layer" else None)
            out.append({"ours": o.label, "theirs": lcs_policy, "scope": scope, "semantics": sem,
                        "ours_misses": o.demand_misses, "theirs_misses": t.misses,
                        "difference": o.demand_misses - t.misses,
                        "relative_difference": (o.demand_misses - t.misses) / max(t.misses, 1),
                        "layers_equal": layers_equal, "expect": expect,
                        "agrees": o.demand_misses == t.misses,
                        "expectation_met": {"equal": o.demand_misses == t.misses,
                                            "ours<=theirs": o.demand_misses <= t.misses}.get(expect)})
    return out


# ------------------------------------------------------------------------------------------ report
def comparison_rows(ours: list[OursRow], theirs: list[TheirsRow]) -> list[dict[str, Any]]:
    """The headline pairs: our policy under each semantics vs the libCacheSim policy, per scope."""
    out = []
    for scope in SCOPES:
        for policy, in_cache, lcs_policy in (("lru", False, "LRU"), ("belady", False, "Belady"),
                                             ("lfu", False, "LFU"), ("lfu", True, "LFU"),
                                             ("belady-forced", False, "Belady")):
            t = next((r for r in theirs if r.policy == lcs_policy and r.scope == scope), None)
            for sem in SEMANTICS:
                o = next((r for r in ours if (r.policy, r.semantics, r.scope, r.lfu_in_cache_counters)
                          == (policy, sem, scope, in_cache)), None)
                if o is None or t is None:
                    continue
                out.append({"configuration": f"{o.label} {sem} {scope}", "theirs": f"{lcs_policy} {scope}",
                            "ours_m_acc_s": o.m_acc_per_s, "theirs_m_req_s": t.m_req_per_s,
                            "ratio": o.m_acc_per_s / t.m_req_per_s})
    return out


def scope_time_ratios(ours: list[OursRow]) -> dict[str, float]:
    """Per-access time, global over per-layer, for lru and belady under each semantics."""
    out = {}
    for policy in ("lru", "belady"):
        for sem in SEMANTICS:
            rows = {r.scope: r for r in ours if (r.policy, r.semantics, r.lfu_in_cache_counters)
                    == (policy, sem, False)}
            if len(rows) == 2:
                out[f"{policy} {sem}"] = rows["per-layer"].m_acc_per_s / rows["global"].m_acc_per_s
    return out


def print_report(fig: dict[str, Any], ours: list[OursRow], theirs: list[TheirsRow]) -> None:
    """Human-readable tables on stdout (the every-policy tables only when ``ours`` is non-empty)."""
    s = fig["stream"]
    print(f"machine: {fig['machine']}")
    print(f"stream: {s['n_events']:,} events, {s['union']:,} union accesses (mean |E| {s['mean_event_size']:.1f}), "
          f"{s['steps']} steps, L={N_LAYERS} N={N_EXPERTS} k={TOP_K} B={BATCH}, tie_break=random seed=0")
    print()
    print(f"Headline, alternated: {fig['pairs']} pairs (ours, theirs) per row; ratio = ours M union acc/s / theirs "
          "M req/s per pair; event-atomic per-layer; our belady includes its preparation inside replay() (event "
          "bitsets or next-use pass), libCacheSim Belady its oracle (next-access vtime)")
    print(f"{'rho':>5s} {'c_l':>7s} {'ours':31s} {'libCacheSim':29s} {'ours M acc/s':>12s} {'theirs M req/s':>14s} "
          f"{'ratio min':>9s} {'ratio median':>12s}")
    for r in fig["alternated"]:
        _, caps = per_layer_capacities(r["rho"], N_LAYERS, N_EXPERTS)
        print(f"{r['rho']:5g} {f'{max(caps)}/{min(caps)}':>7s} {r['ours']:31s} {r['theirs']:29s} "
              f"{r['ours_m_acc_s_median']:12.2f} {r['theirs_m_req_s_median']:14.2f} {r['ratio_min']:9.2f} "
              f"{r['ratio_median']:12.2f}")
    print("(M acc/s and M req/s: from each side's median time over the pairs)")
    print()
    print("Per-layer miss-count cross-check (sequential-ascending order = libCacheSim's request order)")
    print(f"{'rho':>5s} {'ours':14s} {'theirs':7s} {'ours misses':>12s} {'theirs misses':>13s} {'diff':>9s} "
          f"{'layers eq':>9s}  verdict (expectation)")
    for c in fig["headline_checks"]:
        met = "as expected" if c["expectation_met"] else "NOT as expected"
        print(f"{c['rho']:5g} {c['ours']:14s} {c['theirs']:7s} {c['ours_misses']:12,d} {c['theirs_misses']:13,d} "
              f"{c['difference']:+9,d} {c['layers_equal']:>6d}/{N_LAYERS}  "
              f"{'agree' if c['agrees'] else 'differ'}, {met} ({c['expect']})")
    print()
    if ours:
        print_all_policies(fig, ours, theirs)
    print_costs(fig)


def print_all_policies(fig: dict[str, Any], ours: list[OursRow], theirs: list[TheirsRow]) -> None:
    """The ``--all-policies`` tables (best of ``--repeat``, not alternated)."""
    a = fig["all_policies"]
    print(f"--all-policies at rho {a['rho']} (total {a['capacity_total']} blocks; best of {fig['repeat']}, "
          "not alternated)")
    print(f"{'configuration':56s} {'vs libCacheSim':18s} {'ours M acc/s':>12s} {'theirs M req/s':>14s} "
          f"{'ours/theirs':>11s}")
    for r in a["comparison"]:
        print(f"{r['configuration']:56s} {r['theirs']:18s} {r['ours_m_acc_s']:12.2f} {r['theirs_m_req_s']:14.2f} "
              f"{r['ratio']:11.2f}")
    print()
    print("expertcache, every policy (M union acc/s; * = prefix timed, see --max-config-seconds)")
    print(f"{'policy':32s} {'event-atomic per-layer':>22s} {'event-atomic global':>20s} "
          f"{'sequential per-layer':>21s} {'sequential global':>18s}")
    labels = list(dict.fromkeys(r.label for r in ours))
    for label in labels:
        cells = []
        for sem in SEMANTICS:
            for scope in SCOPES:
                r = next((x for x in ours if (x.label, x.semantics, x.scope) == (label, sem, scope)), None)
                cells.append("-" if r is None else f"{r.m_acc_per_s:.2f}{'*' if r.prefix_steps else ''}")
        print(f"{label:32s} {cells[0]:>22s} {cells[1]:>20s} {cells[2]:>21s} {cells[3]:>18s}")
    print()
    print(f"libCacheSim (process_trace on oracleGeneral traces; hashpower {fig['libcachesim']['hashpower']})")
    print(f"{'policy':8s} {'scope':9s} {'process s':>10s} {'oracle s':>9s} {'M req/s':>8s} {'miss ratio':>10s}")
    for t in theirs:
        print(f"{t.policy:8s} {t.scope:9s} {t.process_s:10.3f} {t.oracle_s:9.3f} {t.m_req_per_s:8.2f} "
              f"{t.misses / t.requests:10.4f}")
    lt = fig["libcachesim"]["traces"]
    print(f"trace materialisation, not in the headline: flatten {lt['flatten_s']:.2f} s, write "
          f"{lt['write_s']:.2f} s ({lt['file_bytes'] / 2**20:.0f} MiB, 24 B per request)")
    print()
    print("Miss-count cross-check (sequential-ascending order = libCacheSim's request order)")
    print(f"{'ours':32s} {'theirs':7s} {'scope':9s} {'ours misses':>12s} {'theirs misses':>13s} {'diff':>9s} "
          f"{'layers eq':>9s}  verdict (expectation)")
    for c in a["cross_check"]:
        leq = "-" if c["layers_equal"] is None else f"{c['layers_equal']}/{N_LAYERS}"
        met = {True: "as expected", False: "NOT as expected", None: "no exact expectation"}[c["expectation_met"]]
        verdict = ("agree" if c["agrees"] else "differ") + f", {met}"
        print(f"{c['ours']:32s} {c['theirs']:7s} {c['scope']:9s} {c['ours_misses']:12,d} {c['theirs_misses']:13,d} "
              f"{c['difference']:+9,d} {leq:>9s}  {verdict} ({c['expect']})")
    print()
    print("expertcache per-access time, global / per-layer: "
          + ", ".join(f"{k} {v:.2f}x" for k, v in a["scope_time_ratio"].items()))
    print()


def print_costs(fig: dict[str, Any]) -> None:
    """Memory and JIT lines."""
    m = fig["memory"]
    print(f"memory: peak RSS {m['peak_rss_mib']:.0f} MiB (after stream build {m['rss_after_streams_mib']:.0f} MiB, "
          f"after expertcache {m['rss_after_ours_mib']:.0f} MiB, after libCacheSim "
          f"{m['rss_after_libcachesim_mib']:.0f} MiB); stream arrays {m['stream_bytes'] / 2**20:.0f} MiB "
          f"= {m['bytes_per_union_access']:.2f} B per union access")
    j = fig.get("jit")
    if j:
        print(f"JIT first call (every policy x semantics x scope on a tiny stream): compile "
              f"{j['compile']['first_call_s']:.2f} s with an empty NUMBA_CACHE_DIR, cache load "
              f"{j['cache_load']['first_call_s']:.2f} s reusing it (import {j['compile']['import_s']:.2f} / "
              f"{j['cache_load']['import_s']:.2f} s)")


# -------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None,
                    help=f"scheduling steps (default {STEPS_FULL}, ~10 M union accesses; --quick: {STEPS_QUICK})")
    ap.add_argument("--quick", action="store_true", help=f"smoke run: {STEPS_QUICK} steps (~1 M accesses)")
    ap.add_argument("--pairs", type=int, default=PAIRS,
                    help=f"alternated (ours, theirs) timing pairs per headline row (default {PAIRS})")
    ap.add_argument("--rho", default=",".join(f"{r:g}" for r in RHOS),
                    help="comma list of residency fractions (default 0.1,0.4,0.75; --all-policies uses the first)")
    ap.add_argument("--all-policies", action="store_true",
                    help="also time every registered policy x semantics x scope and libCacheSim LRU/LFU/Belady "
                         "per layer and global (not alternated), at the first --rho")
    ap.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                    help="write every figure as one JSON object: to stdout instead of the tables (bare --json), "
                         "or to PATH in addition to them")
    ap.add_argument("--policies", default=None,
                    help="with --all-policies: comma list of expertcache policies (default: all registered)")
    ap.add_argument("--max-config-seconds", type=float, default=60.0,
                    help="with --all-policies: time only a prefix of the stream when a configuration would take "
                         "longer (default 60)")
    ap.add_argument("--warm-steps", type=int, default=20, help="steps of the warm-up prefix (default 20)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="with --all-policies: timed runs per configuration, best reported (default 1)")
    ap.add_argument("--lcs-default-hashpower", action="store_true",
                    help="use libCacheSim's default hashpower 24 instead of one sized to the universe")
    ap.add_argument("--no-jit-probe", action="store_true", help="skip the compile / cache-load subprocesses")
    ap.add_argument("--workdir", default=None, help="directory for the libCacheSim trace files (default: temp)")
    args = ap.parse_args(argv)
    if args.repeat < 1 or (args.steps is not None and args.steps < 1) or args.warm_steps < 1 or args.pairs < 1:
        ap.error("--repeat, --steps, --warm-steps and --pairs must be positive")
    try:
        args.rhos = [float(r) for r in args.rho.split(",")]
    except ValueError:
        ap.error(f"--rho must be a comma list of numbers; got {args.rho!r}")
    if not all(0.0 <= r <= 1.0 for r in args.rhos):
        ap.error(f"--rho values must lie in [0, 1]; got {args.rho!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the tables (or the JSON object); 1 if an "equal" cross-check failed."""
    try:
        import libcachesim
    except ImportError:
        raise SystemExit("this benchmark needs the peer: pip install libcachesim==0.3.5") from None

    args = parse_args(argv)
    steps = args.steps if args.steps is not None else (STEPS_QUICK if args.quick else STEPS_FULL)
    hp_layer = None if args.lcs_default_hashpower else lcs_hashpower(N_EXPERTS)

    t0 = time.perf_counter()
    stream = drifting_qwen_stream(steps, sample_seed=0)
    calibration = drifting_qwen_stream(steps, sample_seed=1) if args.all_policies else None
    build_s = time.perf_counter() - t0
    rss_streams = maxrss_mib()
    log(f"stream: {stream.union:,} union accesses ({stream.n_events:,} events), built in {build_s:.1f} s")
    warm = stream_prefix(stream, min(args.warm_steps, steps))
    for rho in args.rhos:
        engine_caps = [lc.capacity for lc in replay(warm, ReplayConfig("lru", rho=rho)).per_layer]
        if engine_caps != per_layer_capacities(rho, N_LAYERS, N_EXPERTS)[1]:
            raise SystemExit(f"capacity convention mismatch at rho {rho}: engine {engine_caps}")

    ours: list[OursRow] = []
    theirs: list[TheirsRow] = []
    all_policies = None
    with tempfile.TemporaryDirectory(prefix="lcs-traces-", dir=args.workdir) as tmp:
        traces = build_lcs_traces(stream, Path(tmp), 1)
        log(f"libCacheSim traces: flatten {traces.flatten_s:.2f} s, oracle {traces.oracle_per_layer_s:.2f} s "
            f"per-layer, write {traces.write_s:.2f} s")
        log("alternated pairs:")
        alternated = [row for rho in args.rhos for row in alternate(stream, warm, traces, rho, args.pairs, hp_layer)]
        rss_ours = maxrss_mib()
        log("cross-checks:")
        checks = [c for rho in args.rhos for c in headline_checks(stream, traces, rho, hp_layer)]
        if args.all_policies:
            rho = args.rhos[0]
            total, caps = per_layer_capacities(rho, N_LAYERS, N_EXPERTS)
            log(f"--all-policies at rho {rho}: expertcache")
            policies = args.policies.split(",") if args.policies else list(policy_names(advice=False))
            extra = [("lfu", "sequential-ascending", scope, True) for scope in SCOPES]
            ours = time_ours(stream, calibration, warm, policies, rho, args.max_config_seconds, extra, args.repeat)
            log("--all-policies: libCacheSim")
            theirs = time_theirs(traces, caps, total, not args.lcs_default_hashpower, args.repeat)
            all_policies = {"rho": rho, "capacity_total": total, "capacities": caps,
                            "ours": [{k: v for k, v in asdict(r).items() if k != "per_layer_misses"}
                                     | {"label": r.label, "m_acc_per_s": r.m_acc_per_s} for r in ours],
                            "libcachesim_rows": [{k: v for k, v in asdict(t).items() if k != "per_layer_misses"}
                                                 | {"headline_s": t.headline_s, "m_req_per_s": t.m_req_per_s}
                                                 for t in theirs],
                            "comparison": comparison_rows(ours, theirs),
                            "cross_check": cross_checks(ours, theirs),
                            "scope_time_ratio": scope_time_ratios(ours)}
    rss_theirs = maxrss_mib()

    jit = None if args.no_jit_probe else jit_costs()
    nbytes = stream_nbytes(stream)
    fig: dict[str, Any] = {
        "machine": machine(),
        "versions": {"python": sys.version.split()[0], "numpy": np.__version__,
                     "libcachesim": libcachesim.__version__, "cpu_count": os.cpu_count()},
        "stream": {"steps": steps, "n_events": stream.n_events, "union": stream.union, "logical": stream.logical,
                   "mean_event_size": stream.union / stream.n_events, "build_s": build_s,
                   "provenance": stream.provenance},
        "rhos": args.rhos, "pairs": args.pairs, "repeat": args.repeat,
        "alternated": alternated,
        "headline_checks": checks,
        "libcachesim": {
            "hashpower": "24 (default)" if args.lcs_default_hashpower else
            f"{lcs_hashpower(N_EXPERTS)} per-layer / {lcs_hashpower(N_LAYERS * N_EXPERTS)} global",
            "traces": {k: v for k, v in asdict(traces).items()
                       if k not in ("per_layer_paths", "global_path", "per_layer_n", "layer_ids")},
        },
        "all_policies": all_policies,
        "memory": {"peak_rss_mib": maxrss_mib(), "rss_after_streams_mib": rss_streams,
                   "rss_after_ours_mib": rss_ours, "rss_after_libcachesim_mib": rss_theirs,
                   "stream_bytes": nbytes, "bytes_per_union_access": nbytes / stream.union},
        "jit": jit,
    }
    failed = [c for c in checks + (all_policies["cross_check"] if all_policies else [])
              if c["expect"] == "equal" and not c["expectation_met"]]
    fig["equal_checks_failed"] = len(failed)
    if args.json == "-":
        print(json.dumps(fig, indent=1, default=str))
    else:
        if args.json:
            Path(args.json).write_text(json.dumps(fig, indent=1, default=str) + "\n")
        print_report(fig, ours, theirs)
    for c in failed:
        log(f"FAILED: {c['ours']} {c['semantics']} {c['scope']} misses {c['ours_misses']:,} != "
            f"{c['theirs']} {c['theirs_misses']:,} at rho {c.get('rho', args.rhos[0])}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
