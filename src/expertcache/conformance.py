"""The conformance trace of §2.5: a hand-verifiable executable specification.

3 layers × 4 experts × 5 steps, 30 union accesses (k = 1, three active
requests per step). Under event-atomic replay with ``lru`` at ``rho = 0.5``
(two blocks per layer) and ``tie_break="id"`` it yields 12 hits and 18
misses; sequential ascending replay of the same stream yields 6 hits and 24
misses. ``docs/conformance.md`` derives both counts step by step.
"""

from __future__ import annotations

from importlib import resources

from .events import EventStream, import_events_jsonl
from .replay import ReplayConfig

__all__ = ["conformance_stream", "CONFORMANCE_CONFIG", "EXPECTED"]

#: The stated configuration (policy, capacity, tie-break) of the conformance trace.
CONFORMANCE_CONFIG = ReplayConfig(policy="lru", rho=0.5, scope="per-layer", semantics="event-atomic",
                                  tie_break="id", seed=0)

#: Hand-derived counts (docs/conformance.md): semantics -> (hits, misses).
EXPECTED = {"event-atomic": (12, 18), "sequential-ascending": (6, 24)}


def conformance_stream() -> EventStream:
    """Load the bundled conformance event stream."""
    ref = resources.files("expertcache") / "data" / "conformance_events.jsonl"
    with resources.as_file(ref) as path:
        return import_events_jsonl(path, n_layers=3, n_experts=4, top_k=1)
