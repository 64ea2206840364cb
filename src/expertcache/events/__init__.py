"""The events stage: what a cache sees under a service discipline (EventStream, FCFS batching, rotation, prefill)."""

from .fcfs import (
    ArrivalOffsets,
    build_events,
    decode_rows,
    events_before_request,
    events_from_schedule,
    fcfs_decode_schedule,
    fcfs_schedule,
)
from .stream import EventStream, concat_streams, dump_events_jsonl, import_events_jsonl, read_events

__all__ = ["EventStream", "ArrivalOffsets", "build_events", "concat_streams", "events_before_request",
           "import_events_jsonl", "dump_events_jsonl", "read_events", "fcfs_schedule", "fcfs_decode_schedule",
           "decode_rows", "events_from_schedule"]
