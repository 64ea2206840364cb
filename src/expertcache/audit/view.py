"""The decode view every route-side diagnostic reads: per request, its decode rows in order.

Decode index ``t`` is a request's ``t``-th decode token (0-based), whatever
its absolute position after the prompt; position bands refer to it. The view
holds copies of the decode rows only (prefill rows, often most of a trace,
are not copied).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ValidationError
from ..events import decode_rows
from ..trace import DECODE, RoutingTrace

__all__ = ["DecodeView", "decode_view", "Band", "parse_bands", "DEFAULT_BANDS"]


@dataclass(frozen=True, eq=False)
class DecodeView:
    """Arrays for the kernels.

    Attributes
    ----------
    experts
        ``int16[n_decode, L, k]``: the trace's decode rows, sorted along ``k`` (set comparisons by merge).
    tokens
        ``int64[n_decode]`` token ids (-1 unknown).
    use_tokens
        True when every decode row has a token id; agreement then compares
        tokens, otherwise the full per-layer expert sets (basis ``"routes"``).
    first, length
        ``int64[n_requests]``: first row in ``experts`` and decode length per request.
    """

    experts: np.ndarray
    tokens: np.ndarray
    use_tokens: bool
    first: np.ndarray
    length: np.ndarray
    n_experts: int

    @property
    def basis(self) -> str:
        """``"tokens"`` or ``"routes"``: what positional agreement compares."""
        return "tokens" if self.use_tokens else "routes"

    @property
    def t_max(self) -> int:
        return int(self.length.max())

    def sequence_key(self, r: int) -> bytes:
        """Bytes identifying request ``r``'s generated sequence (token ids, or routes without them)."""
        rows = slice(int(self.first[r]), int(self.first[r] + self.length[r]))
        return (self.tokens[rows] if self.use_tokens else self.experts[rows]).tobytes()


def decode_view(trace: RoutingTrace) -> DecodeView:
    """The decode view of ``trace`` (requests without decode tokens get length 0)."""
    lengths, _ = decode_rows(trace)
    dec = np.flatnonzero(trace.phase == DECODE)   # grouped by request in request order (decode_rows)
    tokens = trace.token_id[dec].astype(np.int64)
    first = np.r_[0, np.cumsum(lengths)[:-1]].astype(np.int64)
    experts = trace.experts[dec]                  # a copy: sorted in place, no second one
    experts.sort(axis=2)
    return DecodeView(experts, tokens, bool((tokens >= 0).all()), first, lengths.astype(np.int64), trace.n_experts)


@dataclass(frozen=True)
class Band:
    """Decode-index band ``[start, stop)``; ``stop=None`` runs to the end of the longest request."""

    start: int
    stop: int | None

    @property
    def label(self) -> str:
        return f"{self.start}-{'' if self.stop is None else self.stop}"

    def mask(self, t_max: int) -> np.ndarray:
        t = np.arange(t_max)
        return (t >= self.start) & (t < (t_max if self.stop is None else self.stop))


#: Early, middle and late decode bands.
DEFAULT_BANDS = (Band(0, 16), Band(16, 64), Band(64, None))


def parse_bands(text: str | None) -> tuple[Band, ...]:
    """Parse ``"0:16,16:64,64:"`` (half-open ranges of decode index; an empty stop runs to the end)."""
    if text is None:
        return DEFAULT_BANDS
    bands = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        parts = item.split(":")
        try:
            if len(parts) != 2:
                raise ValueError
            start = int(parts[0])
            stop = int(parts[1]) if parts[1].strip() else None
        except ValueError:
            raise ValidationError(f"expected bands as START:STOP[,START:STOP...] (STOP may be empty); got {item!r}",
                                  field="bands") from None
        if start < 0 or (stop is not None and stop <= start):
            raise ValidationError(f"a band needs 0 <= START < STOP; got {item!r}", field="bands")
        bands.append(Band(start, stop))
    if not bands:
        raise ValidationError("expected at least one band", field="bands")
    return tuple(bands)
