"""Execute a transformers MoE model with offloaded experts, and check that replay predicts it (issue 22).

Importing this package needs neither torch nor transformers; the executor imports them when used.

Public API
----------
ExecuteConfig                     execution parameters (policy, capacity, contract, batching, device)
CacheController, CONTROLLER_POLICIES
                                  the online cache controller (docs/semantics.md, one unit at a time)
executed_stream(trace, B, offsets)
                                  the stream an execution presents to its cache, from its recorded trace
execute(model, prompts, out, configs)
                                  run every config, write the run directory (see docs/execute.md)
"""

from __future__ import annotations

from typing import Any

from .config import CONTRACTS, EXPERTS_IMPLEMENTATIONS, HOST_TIERS, ExecuteConfig
from .controller import CONTROLLER_POLICIES, CacheController, ControllerPolicy
from .schedule import FcfsScheduler, Forward, fcfs_forwards
from .stream import ExecutedStream, executed_stream

__all__ = ["ExecuteConfig", "CONTRACTS", "HOST_TIERS", "EXPERTS_IMPLEMENTATIONS", "CacheController",
           "CONTROLLER_POLICIES", "ControllerPolicy", "FcfsScheduler", "Forward", "fcfs_forwards",
           "ExecutedStream", "executed_stream", "execute", "Executor"]


def __getattr__(name: str) -> Any:
    if name == "Executor":
        from .runner import Executor

        return Executor
    if name == "execute":
        from .run import execute

        return execute
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
