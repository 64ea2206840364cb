"""The online cache controller of ``expertcache execute``: docs/semantics.md, one unit at a time.

The executor asks the controller two questions per *unit* (one event under the fused
contract, one access under the serialized one): which members are resident
(:meth:`CacheController.classify`, step 1 of the loop), and, after the unit's tokens
have computed, which candidates of ``C ∪ U`` stay (:meth:`CacheController.retain`, steps 2
and 3). It never sees a stream in advance; the only look-ahead it is ever given is
*advice* (a next-use unit per access, from an earlier recording of the same prompts).

Written from docs/semantics.md, not from the replay kernels: plain Python sets and a
sort with ``(key, tie)`` tuples per unit. Needs only numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..replay._kernels import crf_key, crf_update

__all__ = ["CONTROLLER_POLICIES", "ControllerPolicy", "CacheController", "UnitOutcome", "tie_ranks",
           "pinned_blocks", "NEVER"]

#: "Never used again" for next-use keys (the replay's NEVER, 2**31 - 1).
NEVER = 2**31 - 1


@dataclass
class _State:
    """Per-block policy state (docs/semantics.md, step 2)."""

    last: dict[int, int] = field(default_factory=dict)
    freq: dict[int, int] = field(default_factory=dict)
    nxt: dict[int, int] = field(default_factory=dict)
    cycle: dict[int, int] = field(default_factory=dict)
    offset: dict[int, int] = field(default_factory=dict)
    crf: dict[int, float] = field(default_factory=dict)            # LRFU's key
    crf_s: dict[int, tuple[float, float]] = field(default_factory=dict)   # its CRF at the last access, that unit


KeyFn = Callable[["CacheController", int, int, frozenset], Any]


@dataclass(frozen=True)
class ControllerPolicy:
    """One policy of the controller.

    Attributes
    ----------
    name
        Policy name, as ``expertcache replay`` spells it.
    kind
        ``"dynamic"`` (retention by ``key``), ``"static"`` (a pin list, never changed) or
        ``"demand"`` (capacity forced to 0).
    key
        ``key(controller, block, t, misses) -> comparable``: larger is retained (dynamic only).
    needs_next_use
        Whether the key reads next-use advice.
    replay_name
        The replay policy whose counts this one must reproduce.
    """

    name: str
    kind: str
    key: KeyFn | None = None
    needs_next_use: bool = False
    replay_name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("dynamic", "static", "demand"):
            raise ValueError(f"kind must be dynamic, static or demand; got {self.kind!r}")
        if self.kind == "dynamic" and self.key is None:
            raise ValueError(f"dynamic policy {self.name!r} needs a key")


def _lfru(c: CacheController, b: int, t: int, misses: frozenset) -> float:
    age = t - c.state.last[b] + 1
    return float(c.state.freq[b]) / float(age)


def _belady(c: CacheController, b: int, t: int, misses: frozenset) -> int:
    return -c.state.nxt[b]


def _belady_forced(c: CacheController, b: int, t: int, misses: frozenset) -> tuple[int, int]:
    return (1 if b in misses else 0, -c.state.nxt[b])


#: The controller's policies by name; the executor and the CLI read this registry.
CONTROLLER_POLICIES: dict[str, ControllerPolicy] = {p.name: p for p in (
    ControllerPolicy("demand", "demand", replay_name="demand"),
    ControllerPolicy("lru", "dynamic", lambda c, b, t, m: c.state.last[b], replay_name="lru"),
    ControllerPolicy("least-stale", "dynamic", lambda c, b, t, m: (c.state.cycle[b], c.state.offset[b]),
                     replay_name="least-stale"),
    ControllerPolicy("lfu", "dynamic", lambda c, b, t, m: c.state.freq[b], replay_name="lfu"),
    ControllerPolicy("lfru", "dynamic", _lfru, replay_name="lfru"),
    ControllerPolicy("lrfu", "dynamic", lambda c, b, t, m: c.state.crf[b], replay_name="lrfu"),
    ControllerPolicy("belady", "dynamic", _belady, needs_next_use=True, replay_name="belady"),
    ControllerPolicy("belady-forced", "dynamic", _belady_forced, needs_next_use=True, replay_name="belady-forced"),
    ControllerPolicy("predicted-next-use", "dynamic", _belady, needs_next_use=True,
                     replay_name="predicted-next-use"),
    ControllerPolicy("static", "static", replay_name="static"),
)}


def tie_ranks(tie_break: str, seed: int, n_blocks: int) -> np.ndarray:
    """Distinct tie rank per block (docs/semantics.md, Ties): larger is retained among equal keys."""
    if tie_break == "id":
        return n_blocks - np.arange(n_blocks, dtype=np.int64)
    if tie_break == "random":
        return np.random.default_rng(seed).permutation(n_blocks).astype(np.int64)
    raise ValidationError(f"tie_break must be random or id; got {tie_break!r}", field="tie_break")


def pinned_blocks(union_counts: np.ndarray, capacities: Sequence[int], n_layers: int, n_experts: int,
                  scope: str, tie: np.ndarray) -> list[set[int]]:
    """The static pin list per partition: its ``c`` blocks with most union accesses, ties by tie rank."""
    parts = ([range(n_layers * n_experts)] if scope == "global"
             else [range(l * n_experts, (l + 1) * n_experts) for l in range(n_layers)])
    out = []
    for p, blocks in enumerate(parts):
        ranked = sorted(blocks, key=lambda b: (int(union_counts[b]), int(tie[b])), reverse=True)
        out.append(set(ranked[: int(capacities[p])]))
    return out


@dataclass(frozen=True)
class UnitOutcome:
    """What :meth:`CacheController.retain` decided for one unit.

    ``evicted``: residents that leave; ``bypassed``: misses that are not kept (they were
    executed from the workspace); ``admitted``: misses that stay.
    """

    evicted: frozenset
    bypassed: frozenset
    admitted: frozenset


class CacheController:
    """Online per-layer-quota (or global-pool) expert cache, exactly docs/semantics.md.

    Parameters
    ----------
    policy
        A name of :data:`CONTROLLER_POLICIES`.
    n_layers, n_experts
        ``L`` and ``N``; blocks are ``l*N + e``.
    capacities
        One capacity per partition: ``L`` entries (per-layer) or one (global).
    scope
        ``"per-layer"`` or ``"global"``.
    tie
        Tie rank per block (:func:`tie_ranks`).
    lrfu_lambda
        LRFU decay.
    pinned
        Static only: the pin list per partition (:func:`pinned_blocks`).
    next_use
        Policies reading next use: a callable ``next_use(t, block) -> unit`` giving the next unit
        after ``t`` that holds ``block`` (``NEVER`` if none); the executor builds it from advice.
    """

    def __init__(self, policy: str, n_layers: int, n_experts: int, capacities: Sequence[int], scope: str,
                 tie: np.ndarray, *, lrfu_lambda: float = 0.5, pinned: list[set[int]] | None = None,
                 next_use: Callable[[int, int], int] | None = None) -> None:
        if policy not in CONTROLLER_POLICIES:
            raise ValidationError(f"policy must be one of {', '.join(CONTROLLER_POLICIES)}; got {policy!r}",
                                  field="policy")
        self.policy = CONTROLLER_POLICIES[policy]
        if scope not in ("per-layer", "global"):
            raise ValidationError(f"scope must be per-layer or global; got {scope!r}", field="scope")
        self.L, self.N, self.scope = int(n_layers), int(n_experts), scope
        want = 1 if scope == "global" else self.L
        if len(capacities) != want:
            raise ValidationError(f"{scope} scope needs {want} capacities; got {len(capacities)}", field="capacity")
        caps = [int(c) for c in capacities]
        if self.policy.kind == "demand":
            caps = [0] * len(caps)
        self.capacities = caps
        self.tie = np.asarray(tie, dtype=np.int64)
        self.lam = float(lrfu_lambda)
        self.state = _State()
        self.t = 0                                   # the unit clock
        self.layer_clock = [0] * self.L              # LRFU's per-layer unit clock
        self._step: int | None = None
        self._step_first = 0
        if self.policy.needs_next_use and next_use is None:
            raise ValidationError(f"policy {policy!r} needs next-use advice (an earlier recording of the same "
                                  "prompts, or an advice file)", field="advice")
        self.next_use = next_use
        if self.policy.kind == "static":
            if pinned is None or len(pinned) != len(caps):
                raise ValidationError("policy 'static' needs a pin list per partition (from a calibration "
                                      "trace or stream)", field="calibration")
            self.cache = [set(p) for p in pinned]
        else:
            self.cache = [set() for _ in caps]

    # ------------------------------------------------------------------ queries
    def partition(self, layer: int) -> int:
        """Partition index of ``layer``'s blocks."""
        return 0 if self.scope == "global" else int(layer)

    def resident(self, layer: int) -> set[int]:
        """The cache ``C`` of ``layer``'s partition (global block ids); do not mutate."""
        return self.cache[self.partition(layer)]

    def initial_load(self) -> list[int]:
        """Blocks of each layer loaded before the first unit (the static pin list), per layer."""
        out = [0] * self.L
        if self.policy.kind == "static":
            for part in self.cache:
                for b in part:
                    out[b // self.N] += 1
        return out

    def classify(self, layer: int, blocks: Sequence[int]) -> tuple[list[int], list[int]]:
        """Step 1 for one unit: ``(hits, misses)`` of its member blocks, each in the order given."""
        C = self.resident(layer)
        hits = [b for b in blocks if b in C]
        misses = [b for b in blocks if b not in C]
        return hits, misses

    # --------------------------------------------------------------- retention
    def retain(self, layer: int, step: int, blocks: Sequence[int]) -> UnitOutcome:
        """Steps 2 and 3 for the current unit, after its tokens computed; advances the unit clock.

        ``step`` is the scheduler step of the unit (least-stale's cycle).
        """
        t = self.t
        p = self.partition(layer)
        C = self.cache[p]
        U = set(int(b) for b in blocks)
        misses = frozenset(U - C)
        if step != self._step:
            self._step, self._step_first = step, t
        if self.policy.kind == "static":
            self.t += 1
            return UnitOutcome(frozenset(), misses, frozenset())
        st = self.state
        clock = self.layer_clock[layer]
        self.layer_clock[layer] = clock + 1
        for b in U:
            st.last[b] = t
            st.freq[b] = st.freq.get(b, 0) + 1
            if self.next_use is not None:
                st.nxt[b] = int(self.next_use(t, b))
            st.cycle[b] = step
            st.offset[b] = t - self._step_first
            prev, u_last = st.crf_s.get(b, (0.0, 0.0))     # LRFU: the replay kernels' own float expressions
            s_b = float(crf_update(prev, u_last, float(clock), self.lam))
            st.crf_s[b] = (s_b, float(clock))
            st.crf[b] = float(crf_key(s_b, float(clock), self.lam))
        K = C | U
        c = self.capacities[p]
        if len(K) <= c:
            keep = K
        elif c == 0:
            keep = set()
        else:
            key = self.policy.key
            ranked = sorted(K, key=lambda b: (key(self, b, t, misses), int(self.tie[b])), reverse=True)
            keep = set(ranked[:c])
        self.cache[p] = keep
        self.t += 1
        return UnitOutcome(frozenset(C - keep), frozenset(misses - keep), frozenset(misses & keep))
