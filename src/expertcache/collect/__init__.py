"""Collect routing traces from transformers MoE models (issue 4; §3.3, CLR §4.1).

Importing this package needs neither torch nor transformers; :func:`collect`
imports them when called.

Public API
----------
collect(model, prompts, out, config)   record routing into a trace directory (resumable)
CollectConfig                          collection parameters (§3.3 defaults)
read_array(trace_dir, name)            collected "hidden" / "logits" arrays, rows aligned with read_trace
read_prompts(path)                     check a prompts JSONL file
ADAPTERS, RouterAdapter                per-architecture router adapters, keyed by config.model_type
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .adapters import ADAPTERS, RouterAdapter, adapter_for, register_adapter
from .config import CollectConfig
from .prompts import PromptRecord, read_prompts
from .store import read_array

if TYPE_CHECKING:
    from .runner import CollectResult

__all__ = ["collect", "CollectConfig", "read_array", "read_prompts", "PromptRecord", "ADAPTERS", "RouterAdapter",
           "adapter_for", "register_adapter"]


def collect(model: Any, prompts: Any, out: Any, config: CollectConfig | None = None, **kwargs: Any
            ) -> CollectResult:
    """Record the routing of ``model`` on ``prompts`` into ``out``; see :func:`expertcache.collect.runner.collect`."""
    from .runner import collect as _collect

    return _collect(model, prompts, out, config, **kwargs)
