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
    """Per-access advice for event-atomic replay.

    Attributes
    ----------
    next_use
        ``int32[n_access]``: the predicted next unit (event index) that will hold
        each accessed block, ``> its own unit``; ``NEVER`` (2**31 - 1) for "never again".
    provenance
        Which predictor produced it, and from what.
    """

    next_use: np.ndarray
    provenance: dict[str, Any] = field(default_factory=dict)


def save_advice(advice: Advice, path) -> None:
    """Write advice as ``.npz`` (``next_use`` int32, ``provenance`` JSON), loadable without pickle."""
    import json

    with open(path, "wb") as fh:
        np.savez(fh, next_use=advice.next_use, provenance=np.array(json.dumps(advice.provenance)))


def load_advice(path) -> Advice:
    """Read advice written by :func:`save_advice`."""
    import json

    from ..errors import ValidationError

    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise ValueError("not an .npz archive")
        with z:
            return Advice(z["next_use"].astype(np.int32), json.loads(str(z["provenance"])))
    except (OSError, ValueError, KeyError) as exc:
        raise ValidationError(f"cannot read advice ({exc}); expected an .npz from `expertcache nextuse eval "
                              "--advice-out`", source=str(path)) from None


def advice_from_predictions(features: AccessFeatures, log_distance: np.ndarray,
                            provenance: dict[str, Any] | None = None) -> Advice:
    """Turn predicted log next-use distances into next-use advice (distance rounded, at least 1)."""
    dist = np.maximum(1.0, np.rint(np.exp(np.clip(log_distance, 0.0, 40.0))))
    nxt = np.minimum(features.unit + dist, float(K.NEVER)).astype(np.int64)
    return Advice(nxt.astype(np.int32), dict(provenance or {}))


def oracle_advice(features: AccessFeatures) -> Advice:
    """The true next use as advice (a perfect predictor): replays exactly like ``belady``."""
    return Advice(features.next_unit.astype(np.int32), {"predictor": "oracle (true next use)"})
