"""FCFS continuous batching as the executor runs it: prefill forwards, then one decode forward per step.

The decode part is the schedule of :func:`expertcache.events.build_events` (requests ordered by
``(arrival, input order)``, at most ``B`` active, a request executes one decode token per step and
leaves after its last). The executor adds what ``build_events`` leaves out: when a request is
admitted at step ``s`` its prompt runs first, as one prefill forward of its own (admission order),
and then the step's decode forward runs every active request, the newly admitted included (a
request's decode row ``j`` forwards its generated token ``j``; docs/collect.md). A request whose
first generated token ends it (EOS, or ``max_new_tokens = 0``) has a prefill forward and no decode row.

:class:`FcfsScheduler` is online (the executor learns a request's length only when it stops);
:func:`fcfs_forwards` runs the same scheduler with lengths known in advance (from a recorded trace).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Forward", "FcfsScheduler", "fcfs_forwards"]


@dataclass(frozen=True)
class Forward:
    """One model forward of the schedule.

    ``kind`` is ``"prefill"`` (one request, its whole prompt) or ``"decode"`` (one token of every
    active request); ``step`` the scheduler step it belongs to; ``requests`` the request indices
    in batch-row order; ``tokens`` each request's decode index (empty for prefill).
    """

    kind: str
    step: int
    requests: tuple[int, ...]
    tokens: tuple[int, ...] = ()


class FcfsScheduler:
    """Online FCFS continuous batching at concurrency ``batch`` with given arrival steps.

    Per step: :meth:`admit_next` until ``None`` (prefill each admitted request, :meth:`start` it if it
    decodes), then :meth:`decode_forward`, then :meth:`finish` with the requests that stopped.
    """

    def __init__(self, arrivals: Sequence[int], batch: int) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1; got {batch}")
        arr = np.asarray(arrivals, dtype=np.int64)
        self.arrivals = arr
        self.batch = int(batch)
        self.order = [int(i) for i in np.lexsort((np.arange(arr.shape[0]), arr))]
        self.queue = 0
        self.running: list[int] = []          # request indices, admission order
        self.decoded: dict[int, int] = {}     # decode tokens executed so far per running request
        self.step = 0

    @property
    def done(self) -> bool:
        """Whether every request has been admitted and has finished."""
        return self.queue >= len(self.order) and not self.running

    def admit_next(self) -> int | None:
        """The next request admitted at the current step, or ``None`` (batch full, or none has arrived).

        When nothing runs, the clock first jumps to the next arrival. Call :meth:`start` for an
        admitted request that has a decode token before asking for the next one.
        """
        if self.queue >= len(self.order) or len(self.running) >= self.batch:
            return None
        nxt = self.order[self.queue]
        if not self.running and self.arrivals[nxt] > self.step:
            self.step = int(self.arrivals[nxt])
        if self.arrivals[nxt] > self.step:
            return None
        self.queue += 1
        return nxt

    def start(self, request: int) -> None:
        """Request ``request`` (admitted, prefilled) has at least one decode token: it joins the batch."""
        self.running.append(request)
        self.decoded[request] = 0

    def decode_forward(self) -> Forward | None:
        """The decode forward of the current step (``None`` if nothing runs)."""
        if not self.running:
            return None
        return Forward("decode", self.step, tuple(self.running), tuple(self.decoded[r] for r in self.running))

    def finish(self, finished: Sequence[int]) -> None:
        """After the step's decode forward: ``finished`` leave; the clock moves to the next step."""
        for r in self.running:
            self.decoded[r] += 1
        gone = set(finished)
        self.running = [r for r in self.running if r not in gone]
        for r in gone:
            self.decoded.pop(r, None)
        self.step += 1


def fcfs_forwards(lengths: Sequence[int], arrivals: Sequence[int], batch: int) -> list[Forward]:
    """Every forward of the schedule when each request's decode length is known (a recorded trace).

    Parameters
    ----------
    lengths
        Decode rows per request (0: prefill only).
    arrivals
        Arrival step per request.
    batch
        Concurrency ``B``.
    """
    lengths = [int(x) for x in lengths]
    sched = FcfsScheduler(arrivals, batch)
    out: list[Forward] = []
    while not sched.done:
        while (r := sched.admit_next()) is not None:
            out.append(Forward("prefill", sched.step, (r,)))
            if lengths[r] > 0:
                sched.start(r)
        fwd = sched.decode_forward()
        if fwd is None:
            sched.step += 1
            continue
        out.append(fwd)
        sched.finish([r for r, j in zip(fwd.requests, fwd.tokens, strict=True) if j + 1 >= lengths[r]])
    return out
