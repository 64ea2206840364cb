"""The policy registry: names from the literature mapped onto engine keys (§2.3).

A policy scores; the engine decides and counts. Dynamic policies are one key
code of :mod:`._kernels` plus one :func:`register_policy` line here. Static
policies have no key: the engine pins a set and never changes it. A user's
policy written in Python (a numba-jitted key over per-block state) is
registered with ``register_policy("name", key=...)`` (:mod:`.plugins`,
docs/policies.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import ValidationError
from . import keys as K

__all__ = ["Policy", "register_policy", "unregister_policy", "load_plugin", "get_policy", "policy_names", "POLICIES"]


@dataclass(frozen=True)
class Policy:
    """A registered replay policy.

    Attributes
    ----------
    name
        Registry name (CLI choice).
    kind
        ``"dynamic"`` (a key over candidates), ``"static"`` (pinned set) or ``"demand"`` (no cache).
    key_code
        Kernel key code for dynamic policies (and ``demand``, which runs at capacity 0).
    needs_next_use
        Whether the key reads the oracle next-use array.
    needs_calibration
        Whether a calibration stream must be supplied (``static``).
    needs_advice
        Whether its key reads advice produced offline by a predictor (docs/design.md §1).
    causal
        Whether the policy uses only past information (eligible as "best causal", §7.1).
    loop
        Which engine loop replays it: ``"list"`` (recency list, LRU order), ``"belady"``
        (int64 next-use heap), ``"heap"`` (generic key heap, keys that change only on
        access), ``"scan"`` (re-rank every candidate; drifting keys), ``"static"``, or
        ``"plugin"`` (a policy registered from Python: the scan loop calling its key).
        All make the same decision for a given key (docs/performance.md).
    stack
        Whether its ranking at each unit boundary is independent of the capacity, so that
        caches of all capacities are nested (Mattson's stack property): one pass gives
        every capacity (:func:`expertcache.replay.replay_curve`).
    description
        One line for help texts and reports.
    key_fn, update_fn, state_init
        Plugin policies only (``loop="plugin"``, docs/policies.md): the jitted key
        ``key(b, t, last, freq, state) -> float``, the optional jitted update
        ``update(b, t, hit, last, freq, state)`` and the initial value of each column
        of the per-block ``state`` array.
    """

    name: str
    kind: str
    key_code: int
    needs_next_use: bool = False
    needs_calibration: bool = False
    needs_advice: bool = False
    causal: bool = True
    stack: bool = False
    loop: str = "heap"
    description: str = ""
    key_fn: Callable | None = None
    update_fn: Callable | None = None
    state_init: tuple[float, ...] = ()


POLICIES: dict[str, Policy] = {}


def register_policy(policy: Policy | str, *, key: Callable | None = None, update: Callable | None = None,
                    state: Sequence[float] = (), description: str = "") -> Policy:
    """Add a policy to the registry; a duplicate name raises ``ValueError``.

    Parameters
    ----------
    policy
        A :class:`Policy` (the built-ins), or the name of a new policy written in Python.
    key, update, state, description
        For a name: the numba-jitted key ``key(b, t, last, freq, state) -> float`` (the
        larger is retained), an optional jitted ``update(b, t, hit, last, freq, state)``
        run on every access, and the initial value of each per-block state column
        (docs/policies.md). The functions are compiled and checked here; one that does not
        fit the signature raises a one-line :class:`~expertcache.errors.ValidationError`.

    Examples
    --------
    See docs/policies.md for a complete LRU-2 in a dozen lines.
    """
    if isinstance(policy, str):
        from .plugins import compile_plugin  # numba loads only when a Python policy is registered

        if policy in POLICIES:
            raise ValidationError(f"policy {policy!r} is already registered", field="policy")
        key_fn, update_fn, init = compile_plugin(policy, key, update, state)
        policy = Policy(policy, "dynamic", -1, loop="plugin", description=description or "policy registered from Python",
                        key_fn=key_fn, update_fn=update_fn, state_init=init)
    elif key is not None or update is not None or state or description:
        raise ValidationError("key, update, state and description apply when registering by name",
                              field="policy")
    if policy.name in POLICIES:
        raise ValueError(f"policy {policy.name!r} is already registered")
    POLICIES[policy.name] = policy
    return policy


def unregister_policy(name: str) -> None:
    """Remove a policy registered from Python (``register_policy(name, key=...)``); built-ins stay."""
    policy = get_policy(name)
    if policy.loop != "plugin":
        raise ValidationError(f"policy {name!r} is built in and cannot be unregistered", field="policy")
    del POLICIES[name]


def load_plugin(path: str) -> list[str]:
    """Run the Python file ``path`` (which calls ``register_policy``); return the policy names it added.

    This executes the file, as ``python path`` would: load only files you trust. Any failure
    (missing file, syntax error, an exception, a bad policy) is one line naming the file. A file
    already loaded in this process (and whose policies are still registered) is not run again.
    """
    import importlib.util
    import os

    if not os.path.isfile(path):
        raise ValidationError("no such plugin file (a Python file that calls register_policy)", source=path,
                              field="plugin")
    real = os.path.realpath(path)
    if real in _LOADED and all(n in POLICIES for n in _LOADED[real]):
        return list(_LOADED[real])
    before = set(POLICIES)
    name = "expertcache_plugin_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ValidationError("not a Python file", source=path, field="plugin")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ValidationError as exc:
        raise ValidationError(exc.detail, source=path, field=exc.field or "plugin") from None
    except Exception as exc:  # the user's file: whatever it raises becomes one line
        from .plugins import first_line

        raise ValidationError(f"the plugin failed to load: {type(exc).__name__}: {first_line(exc)}", source=path,
                              field="plugin") from None
    _LOADED[real] = [n for n in POLICIES if n not in before]
    return list(_LOADED[real])


_LOADED: dict[str, list[str]] = {}


def get_policy(name: str) -> Policy:
    """Look a policy up by name, with a helpful error listing the choices."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValidationError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}",
                              field="policy") from None


def policy_names(advice: bool = True) -> tuple[str, ...]:
    """Registered policy names, in registration order (``advice=False``: those that need no predictor)."""
    return tuple(n for n, p in POLICIES.items() if advice or not p.needs_advice)


register_policy(Policy("demand", "demand", K.KEY_LRU, loop="list", description="no cache: every union access transfers"))
register_policy(Policy("static", "static", -1, needs_calibration=True, loop="static",
                       description="top-c experts per layer of a calibration stream, pinned"))
register_policy(Policy("static-same-trace", "static", -1, causal=False, loop="static",
                       description="static pinned set fitted on the replayed stream (diagnostic only)"))
register_policy(Policy("lru", "dynamic", K.KEY_LRU, stack=True, loop="list", description="least recently used (event clock)"))
register_policy(Policy("lfu", "dynamic", K.KEY_LFU, stack=True, description="least frequently used"))
register_policy(Policy("lfru", "dynamic", K.KEY_LFRU, stack=True, loop="scan", description="frequency / age"))
register_policy(Policy("lrfu", "dynamic", K.KEY_LRFU, stack=True,
                       description="LRFU (Lee et al.): decayed recency-frequency, lambda = ReplayConfig.lrfu_lambda"))
# least-stale's key, the (cycle, offset in the cycle) of a block's last use above the tie rank, grows with the
# unit's position exactly as lru's clock does, so it evicts what lru evicts in every scope, semantics, tie mode and
# warm-up (tests/test_twin.py checks it against the naive twin's own least-stale): it runs on lru's loops.
register_policy(Policy("least-stale", "dynamic", K.KEY_LEAST_STALE, stack=True, loop="list",
                       description="SpecMD least-stale: untouched in the current cycle first"))
register_policy(Policy("belady", "dynamic", K.KEY_BELADY, needs_next_use=True, causal=False, stack=True,
                       loop="belady",
                       description="offline optimum with bypass admission"))
register_policy(Policy("belady-forced", "dynamic", K.KEY_BELADY_FORCED, needs_next_use=True, causal=False,
                       loop="belady",
                       description="Belady that must admit every miss (gap decomposition probe)"))
register_policy(Policy("predicted-next-use", "dynamic", K.KEY_BELADY, needs_advice=True, loop="belady",
                       description="Belady's machinery on predicted next uses (advice; §7.3)"))
