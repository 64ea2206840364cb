"""Residency policies written in Python: a numba-jitted key over per-block state (docs/policies.md).

A plugin policy scores exactly as a built-in does: the engine owns the loop,
the capacity, the per-layer quota, the units of either semantics, the tie ranks
drawn from the seed, the warm-up and every counter; the policy supplies

* ``key(b, t, last, freq, state) -> float``: the retention key of candidate
  block ``b`` at the end of unit ``t`` (the larger is retained, ties by the tie
  rank), and optionally
* ``update(b, t, hit, last, freq, state) -> None``: run on every access, in
  access order, *before* the engine sets ``last[b] = t`` and ``freq[b] += 1``
  (so it still sees the block's previous access clock and count).

``last`` (``int64[L*N]``, -1 before the first access) and ``freq``
(``int64[L*N]``) are the engine's; ``state`` (``float64[L*N, n_state]``) is the
policy's own, initialised per column from ``state_init``. Both functions are
compiled with this fixed signature at registration, so a wrong one fails there
with one line, not deep inside a replay.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Sequence

import numba
import numpy as np
from numba import types

from ..errors import ValidationError
from . import _kernels as K

__all__ = ["compile_plugin", "first_line", "KEY_SIGNATURE", "UPDATE_SIGNATURE", "plugin_kernel", "initial_state"]

_IDX = types.int64
_I64 = types.Array(types.int64, 1, "C")
_STATE = types.Array(types.float64, 2, "C")
#: ``key(b, t, last, freq, state)``: the types each key is compiled for.
KEY_SIGNATURE = (_IDX, _IDX, _I64, _I64, _STATE)
#: ``update(b, t, hit, last, freq, state)``: the types each update is compiled for.
UPDATE_SIGNATURE = (_IDX, _IDX, types.boolean, _I64, _I64, _STATE)
_KEY_ARGS = ("b", "t", "last", "freq", "state")
_UPDATE_ARGS = ("b", "t", "hit", "last", "freq", "state")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def compile_plugin(name: str, key: Callable | None, update: Callable | None,
                   state: Sequence[float]) -> tuple[Callable, Callable | None, tuple[float, ...]]:
    """Check and compile a Python policy's functions: ``(key, update, state_init)``, the key and update as
    numba dispatchers compiled for :data:`KEY_SIGNATURE` and :data:`UPDATE_SIGNATURE`.

    Raises
    ------
    ValidationError
        One line naming the policy: a bad name, a key or update that is not a function of the
        fixed arguments, does not compile in numba's nopython mode, or whose key is not a number.
    """
    where = f"policy {name!r}"
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", name):
        raise ValidationError(f"a policy name must be letters, digits, '_.+-' (a CLI choice); got {name!r}",
                              field="policy")
    if key is None:
        raise ValidationError(f"{where} needs key=: a numba-jitted key(b, t, last, freq, state) -> float",
                              field="key")
    try:
        init = tuple(float(v) for v in state)
    except (TypeError, ValueError):
        raise ValidationError(f"{where}: state must be a sequence of numbers (each column's initial value); "
                              f"got {state!r}", field="state") from None
    key_fn = _compiled(where, "key", key, _KEY_ARGS, KEY_SIGNATURE)
    ret = key_fn.overloads[KEY_SIGNATURE].signature.return_type
    if not isinstance(ret, (types.Number, types.Boolean)) or isinstance(ret, types.Complex):
        raise ValidationError(f"{where}: key must return a real number (float or int); it returns {ret}",
                              field="key")
    update_fn = _compiled(where, "update", update, _UPDATE_ARGS, UPDATE_SIGNATURE) if update is not None else None
    return key_fn, update_fn, init


def _compiled(where: str, role: str, fn: Callable, names: tuple[str, ...], sig: tuple) -> Callable:
    """``fn`` as a numba dispatcher compiled for ``sig`` (a plain function is jitted here)."""
    wanted = f"{role}({', '.join(names)})"
    if not callable(fn):
        raise ValidationError(f"{where}: {role} must be a function {wanted}; got {type(fn).__name__}", field=role)
    py = getattr(fn, "py_func", fn)
    try:
        params = list(inspect.signature(py).parameters.values())
    except (TypeError, ValueError):
        params = None
    if params is None or len(params) != len(names) or any(
            p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
        got = "?" if params is None else ", ".join(p.name for p in params)
        raise ValidationError(f"{where}: {role} must take exactly {wanted}; got {role}({got})", field=role)
    dispatcher = fn if isinstance(fn, numba.core.registry.CPUDispatcher) else numba.njit(fn)
    try:
        dispatcher.compile(sig)
    except Exception as exc:  # numba raises TypingError, UnsupportedError, NotDefinedError, ...
        raise ValidationError(f"{where}: {role} does not compile with numba (nopython) for {wanted}: "
                              f"{first_line(exc)}", field=role) from None
    return dispatcher


def first_line(exc: Exception) -> str:
    """The informative line of a numba error (its first line is usually 'Failed in nopython mode ...')."""
    lines = [ln.strip() for ln in _ANSI.sub("", str(exc)).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(("Failed in", "During:", "File ", "^"))]
    text = (useful or lines or [type(exc).__name__])[0]
    return text if len(text) <= 200 else text[:197] + "..."


@numba.njit(nogil=True)
def _no_update(b, t, hit, last, freq, state):  # pragma: no cover - compiled
    return None


_KERNELS: dict[tuple[Callable, Callable], Callable] = {}


def plugin_kernel(policy) -> Callable:
    """The replay loop specialised to ``policy``'s key and update (compiled once per pair, on first use)."""
    pair = (policy.key_fn, policy.update_fn or _no_update)
    if pair not in _KERNELS:
        _KERNELS[pair] = _make_kernel(*pair)
    return _KERNELS[pair]


def _make_kernel(key: Callable, update: Callable) -> Callable:
    max_unit_of, slots_of, decide = K._max_unit, K._slots, K._scan_decide
    neg_inf = -math.inf

    @numba.njit(nogil=True, error_model="numpy")
    def replay_plugin(offsets, expert, ev_layer, n_experts, n_layers, global_scope, atomic, capacity, tie,
                      state, count_from, hits, misses, hit_flag):  # pragma: no cover - compiled
        # the scan loop of _kernels.replay_scan, with the policy's key and update in place of _key/_touch
        n_blocks = n_layers * n_experts
        record = hit_flag.shape[0] > 0
        n_events = offsets.shape[0] - 1
        n_parts = capacity.shape[0]
        max_unit = max_unit_of(offsets, atomic)
        slots = slots_of(capacity, n_blocks)
        res = np.empty((n_parts, max(slots, 1)), dtype=np.int64)
        n_res = np.zeros(n_parts, dtype=np.int64)
        in_cache = np.zeros(n_blocks, dtype=np.bool_)
        last = np.full(n_blocks, -1, dtype=np.int64)
        freq = np.zeros(n_blocks, dtype=np.int64)
        cand = np.empty(slots + max_unit, dtype=np.int64)
        sel = np.empty((1, slots + max_unit), dtype=np.int64)
        sel_pos = np.full(n_blocks, -1, dtype=np.int64)
        k1 = np.zeros(n_blocks, dtype=np.float64)
        k2 = np.zeros(n_blocks, dtype=np.int64)
        miss_buf = np.empty(max_unit, dtype=np.int64)
        t = 0
        for i in range(n_events):
            layer = ev_layer[i]
            p = 0 if global_scope else layer
            cap = capacity[p]
            base = layer * n_experts
            lo = offsets[i]
            hi = offsets[i + 1]
            n_units = 1 if atomic else hi - lo
            for u in range(n_units):
                a_lo = lo if atomic else lo + u
                a_hi = hi if atomic else lo + u + 1
                n_miss = 0
                for a in range(a_lo, a_hi):
                    b = base + np.int64(expert[a])
                    hit = in_cache[b]
                    if hit:
                        if i >= count_from:
                            hits[layer] += 1
                        if record:
                            hit_flag[a] = 1
                    else:
                        if i >= count_from:
                            misses[layer] += 1
                        miss_buf[n_miss] = b
                        n_miss += 1
                    update(b, np.int64(t), hit, last, freq, state)
                    last[b] = t
                    freq[b] += 1
                r = n_res[p]
                if n_miss and r + n_miss <= cap:
                    for j in range(n_miss):
                        b = miss_buf[j]
                        res[p, r + j] = b
                        in_cache[b] = True
                    n_res[p] = r + n_miss
                elif n_miss:
                    n_cand = r + n_miss
                    for j in range(r):
                        cand[j] = res[p, j]
                    for j in range(n_miss):
                        cand[r + j] = miss_buf[j]
                    for j in range(n_cand):
                        b = cand[j]
                        v = np.float64(key(b, np.int64(t), last, freq, state))
                        k1[b] = neg_inf if v != v else v      # a NaN key ranks lowest
                    decide(cand, n_cand, cap, sel, sel_pos, k1, k2, tie, in_cache, res, p, freq, False)
                    n_res[p] = cap
                t += 1

    return replay_plugin


def initial_state(policy, n_blocks: int) -> np.ndarray:
    """``float64[n_blocks, n_state]``: every block's state columns at their initial values."""
    state = np.empty((n_blocks, len(policy.state_init)), dtype=np.float64)
    state[:] = np.asarray(policy.state_init, dtype=np.float64)
    return state

