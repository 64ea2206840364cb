"""The experiment stage: scoped §8–§9 experiments, declarative sweeps and pre-registration (§3.5, §7.1, A.1).

``scoped`` holds the mechanism experiments of §8–§9 (static vs dynamic, service
disciplines, affinity, warm transition, category partition) and ``prereg`` the
hashed pre-registration documents. For sweeps, ``load_spec`` reads a TOML
spec; ``expand`` turns it into conditions with stable IDs and hashes;
``run_spec`` runs the ones a result store lacks (locally or on Ray) and stores
a tidy Parquet table; ``summarize`` pivots it.
Names load on first use, so importing this package does no work.
"""

from __future__ import annotations

from typing import Any

_NAMES = {
    "ExperimentSpec": "spec", "Condition": "spec", "PlannedCondition": "spec", "InputSpec": "spec",
    "SelectionSpec": "spec", "load_spec": "spec", "spec_from_dict": "spec", "expand": "spec",
    "Task": "tasks", "METRICS": "tasks", "plan_tasks": "tasks", "RunReport": "runner", "run_spec": "runner",
    "ResultStore": "store", "read_results": "store", "RESULT_SCHEMA": "store",
    "EXECUTORS": "executors", "make_executor": "executors",
    "Summary": "summary", "summarize": "summary", "gap_rows": "summary", "metric_values": "summary",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        import importlib

        return getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
