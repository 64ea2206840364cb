"""The trace stage: what a model routed (RoutingTrace and its Parquet form), importers, generator, labels."""

from .importers import import_routes_jsonl
from .model import (
           DECODE,
           PHASES,
           PREFILL,
           RoutingTrace,
           read_trace,
           select_requests,
           validate_trace,
)

__all__ = ["RoutingTrace", "PHASES", "PREFILL", "DECODE", "read_trace", "validate_trace", "import_routes_jsonl",
           "select_requests"]
