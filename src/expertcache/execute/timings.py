"""Timing of copies, layers and steps: CUDA events on a GPU, ``perf_counter_ns`` on CPU (needs torch).

On CPU the clock can instead be the calling thread's CPU time (``clock="cpu"``, ``thread_time_ns``): what
the span's work cost the executing thread, without the time other processes held the core. On a machine
shared with other work that is the steadier figure (``expertcache timing calibrate --clock cpu``); with more
than one torch thread it misses the work of the other threads.

Every timed span becomes one row of ``timings.parquet``: ``kind`` (``copy``, ``layer``, ``forward``),
the forward index, its phase, the MoE layer (``-1`` for a forward), the expert (copies; else ``-1``),
bytes moved (copies) and the duration in nanoseconds. On CUDA the events are recorded on the
current stream and resolved once per forward (after the forward's own synchronisation), so timing
adds no extra device synchronisation inside a forward.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["SpanTimer", "TIMING_COLUMNS", "CLOCKS", "write_timings"]

#: CPU clocks of :class:`SpanTimer`: wall time, or the calling thread's CPU time.
CLOCKS = {"wall": time.perf_counter_ns, "cpu": time.thread_time_ns}
TIMING_COLUMNS = ("kind", "forward", "phase", "layer", "expert", "bytes", "ns")


class SpanTimer:
    """Collects spans; ``begin()`` returns a token, ``end(token, ...)`` records the span.

    ``clock`` (CPU only; CUDA spans are CUDA events): ``"wall"`` or ``"cpu"`` (:data:`CLOCKS`).
    """

    def __init__(self, device: Any, clock: str = "wall") -> None:
        import torch

        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {', '.join(CLOCKS)}; got {clock!r}")
        self._now = CLOCKS[clock]
        self.clock = clock
        self.cuda = getattr(device, "type", str(device)) == "cuda"
        self._torch = torch
        self.rows: list[tuple] = []
        self._pending: list[tuple] = []

    def begin(self) -> Any:
        """Start a span."""
        if self.cuda:
            ev = self._torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return self._now()

    def end(self, token: Any, kind: str, forward: int, phase: int, layer: int = -1, expert: int = -1,
            nbytes: int = 0) -> None:
        """End the span started by ``token``."""
        if self.cuda:
            ev = self._torch.cuda.Event(enable_timing=True)
            ev.record()
            self._pending.append((token, ev, kind, forward, phase, layer, expert, nbytes))
        else:
            self.rows.append((kind, forward, phase, layer, expert, nbytes, self._now() - token))

    def flush(self) -> None:
        """Resolve pending CUDA events (synchronises); a no-op on CPU."""
        if self._pending:
            self._torch.cuda.synchronize()
            for start, stop, kind, forward, phase, layer, expert, nbytes in self._pending:
                self.rows.append((kind, forward, phase, layer, expert, nbytes,
                                  int(round(start.elapsed_time(stop) * 1e6))))
            self._pending.clear()

    def columns(self) -> dict[str, np.ndarray]:
        """The spans as columns (:data:`TIMING_COLUMNS`)."""
        self.flush()
        cols = list(zip(*self.rows, strict=True)) if self.rows else [()] * len(TIMING_COLUMNS)
        out: dict[str, np.ndarray] = {"kind": np.array(cols[0], dtype=object)}
        for name, values in zip(TIMING_COLUMNS[1:], cols[1:], strict=True):
            out[name] = np.array(values, dtype=np.int64)
        return out


def write_timings(path: Path, columns: dict[str, np.ndarray]) -> None:
    """Write the timing columns as Parquet (``path`` is a temporary location the caller renames)."""
    import pyarrow as pa

    from ..storage import write_parquet

    table = pa.table({"kind": pa.array(columns["kind"].tolist(), pa.string()),
                      **{k: pa.array(columns[k], pa.int64()) for k in TIMING_COLUMNS[1:]}})
    write_parquet(path, table, "one timed span of the executor: its kind, forward, phase, layer, expert, bytes and ns",
                  compression="snappy")
