"""Advice: arrays aligned to an event stream, produced offline by a predictor and consumed by replay."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..replay import _kernels as K
from .features import AccessFeatures

__all__ = ["Advice", "advice_from_predictions", "oracle_advice", "save_advice", "load_advice"]


@dataclass(frozen=True)
class Advice:
    """Arrays aligned to an event stream, produced offline by a predictor (docs/design.md §1).

    Every field is optional except that an ``Advice`` carries at least one array.

    Attributes
    ----------
    next_use
        ``int32[n_access]``: the predicted next unit (event index) that will hold
        each accessed block, ``> its own unit``; ``NEVER`` (2**31 - 1) for "never again".
        Read by the ``predicted-next-use`` policy of :func:`expertcache.replay.replay`.
    priority
        ``float32[n_events, N]``: post-access retention priority of every expert of
        event ``i``'s layer, higher = keep. Read by the update operator ``U_B`` of
        :func:`expertcache.replay.proactive.replay_proactive` at the end of event ``i``
        (CLR Alg. 1, ``s^T = p^R + p^T``). NaN counts as ``-inf``.
    prefetch_score
        ``float32[n_events, N]``: pre-access scores of event ``i`` (CLR Alg. 2, ``s^ST``);
        NaN or ``-inf`` = not a candidate. The top-``R`` candidates are examined before
        the event; every insertion is one proactive load.
    provenance
        Which predictor produced it, and from what.

    With several active requests per event (``B > 1``) the arrays stay event-level:
    producers sum the per-request priorities (and scores) over the active requests
    (docs/prefetch.md).
    """

    next_use: np.ndarray | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    priority: np.ndarray | None = None
    prefetch_score: np.ndarray | None = None

    def __post_init__(self) -> None:
        from ..errors import ValidationError

        if self.next_use is None and self.priority is None and self.prefetch_score is None:
            raise ValidationError("advice must carry at least one of next_use, priority, prefetch_score",
                                  field="advice")
        for name in ("priority", "prefetch_score"):
            a = getattr(self, name)
            if a is not None and (not isinstance(a, np.ndarray) or a.ndim != 2):
                raise ValidationError(f"advice {name} must be a 2-D float32 array [n_events, N]; "
                                      f"got {getattr(a, 'shape', type(a).__name__)}", field=name)

    def validate(self, stream, *, need: tuple[str, ...] = ()) -> None:
        """Check the arrays against ``stream`` (shapes, dtypes, finiteness); raise ``ValidationError``.

        ``need`` names the fields the caller reads and that must therefore be present.
        ``priority`` may hold NaN (= ``-inf``, never preferred) and ``+-inf``;
        ``prefetch_score`` may hold NaN/``-inf`` (not a candidate) and ``+inf``.
        """
        from ..errors import ValidationError

        for name in need:
            if getattr(self, name) is None:
                raise ValidationError(f"this replay reads advice {name!r}, which the advice file lacks "
                                      f"(it holds: {', '.join(self.fields_present())})", field=name)
        shape = (stream.n_events, stream.n_experts)
        for name in ("priority", "prefetch_score"):
            a = getattr(self, name)
            if a is None:
                continue
            if a.shape != shape or a.dtype != np.float32:
                raise ValidationError(f"advice {name} must be float32 with shape (n_events, N) = {shape}; "
                                      f"got {a.dtype} {a.shape}. Produce advice for this very stream.",
                                      field=name)
        if self.next_use is not None:
            nxt = np.asarray(self.next_use)
            if nxt.shape != (stream.union,) or nxt.dtype != np.int32:
                raise ValidationError(f"advice next_use must be int32 with one entry per union access "
                                      f"({stream.union}); got {nxt.dtype} {nxt.shape}", field="next_use")

    def fields_present(self) -> tuple[str, ...]:
        """Names of the arrays this advice carries."""
        return tuple(n for n in ("next_use", "priority", "prefetch_score") if getattr(self, n) is not None)


def save_advice(advice: Advice, path) -> None:
    """Write advice as ``.npz`` (the arrays present, ``provenance`` as JSON), loadable without pickle."""
    import json

    arrays = {n: getattr(advice, n) for n in advice.fields_present()}
    with open(path, "wb") as fh:
        np.savez(fh, provenance=np.array(json.dumps(advice.provenance)), **arrays)


def load_advice(path, stream=None) -> Advice:
    """Read advice written by :func:`save_advice` (no pickle), checking sizes before allocating.

    Every member's declared shape and dtype is checked against the bytes actually present (a crafted
    header cannot make the reader allocate more than the file holds) and, when ``stream`` is given,
    against that stream: ``priority`` / ``prefetch_score`` ``float32[n_events, N]``, ``next_use``
    ``int32[union]``.

    Raises
    ------
    ValidationError
        One line naming the file and the offending member.
    """
    import json

    from ..errors import ValidationError
    from ..storage import read_npz

    src = str(path)
    dense = None if stream is None else (stream.n_events, stream.n_experts)
    expect = {"priority": (dense or (None, None), {"float32"}),
              "prefetch_score": (dense or (None, None), {"float32"}),
              "next_use": ((None,) if stream is None else (stream.union,), {"int32", "int64"}),
              "provenance": ((), None)}
    try:
        z = read_npz(path, expect=expect)
    except ValidationError as exc:
        raise ValidationError(f"cannot read advice: {exc.detail}; expected an .npz from `expertcache nextuse "
                              "eval --advice-out` or an advice producer", source=src, field=exc.field) from None
    names = set(z)
    if not names & {"next_use", "priority", "prefetch_score"}:
        raise ValidationError("cannot read advice (it holds none of next_use, priority, prefetch_score); expected "
                              "an .npz from `expertcache nextuse eval --advice-out` or an advice producer of "
                              "expertcache.prefetch", source=src)
    provenance: dict[str, Any] = {}
    if "provenance" in names:
        p = z["provenance"]
        if p.dtype.kind != "U":
            raise ValidationError("expected a JSON string", source=src, field="provenance")
        try:
            provenance = json.loads(str(p))
        except (ValueError, RecursionError):
            raise ValidationError("not valid JSON", source=src, field="provenance") from None
        if not isinstance(provenance, dict):
            raise ValidationError("expected a JSON object", source=src, field="provenance")
    nxt = z.get("next_use")
    if nxt is not None and nxt.dtype != np.int32:
        if nxt.size and (int(nxt.min()) < 0 or int(nxt.max()) > int(K.NEVER)):
            raise ValidationError(f"next_use must be in [0, {int(K.NEVER)}] (int32); got {int(nxt.min())}.."
                                  f"{int(nxt.max())}", source=src, field="next_use")
        nxt = nxt.astype(np.int32)
    return Advice(nxt, provenance, z.get("priority"), z.get("prefetch_score"))


def advice_from_predictions(features: AccessFeatures, log_distance: np.ndarray,
                            provenance: dict[str, Any] | None = None) -> Advice:
    """Turn predicted log next-use distances into next-use advice (distance rounded, at least 1)."""
    dist = np.clip(log_distance, 0.0, 40.0)        # one array, each step in place: the values of
    np.exp(dist, out=dist)                         # min(unit + max(1, rint(exp(clip(x)))), NEVER)
    np.rint(dist, out=dist)
    np.maximum(dist, 1.0, out=dist)
    np.add(features.unit, dist, out=dist)
    np.minimum(dist, float(K.NEVER), out=dist)
    nxt = dist.astype(np.int64)
    del dist
    return Advice(nxt.astype(np.int32), dict(provenance or {}))


def oracle_advice(features: AccessFeatures) -> Advice:
    """The true next use as advice (a perfect predictor): replays exactly like ``belady``."""
    return Advice(features.next_unit.astype(np.int32), {"predictor": "oracle (true next use)"})
