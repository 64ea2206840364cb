"""Fitting a hardware profile to measured spans (numpy only; the measurement is ``expertcache.execute.calibrate``).

Every cost of :class:`~expertcache.timing.HardwareProfile` is linear in what the timeline knows about an event
or a step, so each is fitted by a small linear regression, per MoE layer where the profile is per layer:

* **dense work** of layer ``l`` (its decoder layer minus its MoE block): ``a_l + b_l * tokens``, fitted on the
  decode forwards (what time per output token is made of: a batched decode forward's attention runs with a
  padding mask over the KV cache, a prefill's over its own causal window, and one line through both
  mispredicts decode); the prefill residuals are reported beside;
* **MoE block** of layer ``l`` with every member resident: ``c0_l + c1_l * members + c2_l * routed tokens``;
  ``c1_l`` is ``expert_fixed_s``, ``c2_l`` ``expert_per_token_s``, and the block's own fixed part ``c0_l``
  (the controller's and the kernel's per-event overhead) joins the dense fixed cost, since the timeline pays
  both once per event: ``dense_fixed_s = a_l + c0_l``, ``dense_per_token_s = b_l``;
* **step** (the forward minus its MoE decoder layers): ``step_fixed_s + step_per_token_s * tokens``, on the
  decode forwards likewise;
* **link**: the standalone copies of one and four expert blocks give ``bytes / second`` (the slope); the
  per-transfer ``latency_s`` is what the executor's own copies of one block take beyond ``bytes / bandwidth``
  (its copy path: one ``copy_`` per stacked tensor, the slot bookkeeping), or, without such copies, the
  standalone intercept.

Fits are least absolute deviations (a median regression: a preempted sample moves it little, and the
validation compares medians), constrained to non-negative coefficients. ``extra["fit"]`` holds, per fit, the
sample count and the median and 90th-percentile absolute relative residual.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ..errors import ValidationError
from .profile import HardwareProfile

__all__ = ["CalibrationSpans", "fit_nonnegative", "fit_profile", "residual_summary"]


@dataclass(frozen=True)
class CalibrationSpans:
    """Measured spans of calibration runs, in seconds; one entry per event, step or copy.

    Attributes
    ----------
    event_layer, event_tokens, event_members, event_routed : int64[n_events]
        MoE layer, tokens of the forward, distinct experts (members) and routed tokens (tokens * k) of each
        event whose members were all resident.
    event_dense_s, event_moe_s : float64[n_events]
        The event's decoder layer minus its MoE block, and the MoE block.
    step_tokens : int64[n_steps]
        Tokens of each forward.
    step_other_s : float64[n_steps]
        The forward minus its MoE decoder layers.
    copy_bytes : int64[n_copies]
        Bytes of each standalone link copy.
    copy_s : float64[n_copies]
        Its duration.
    transfer_s : float64[n_transfers]
        The executor's own copies of one expert block (may be empty).
    event_decode, step_decode : bool[n_events], bool[n_steps], optional
        Whether the event's (the step's) forward is a decode forward; ``None``: all are.
    """

    event_layer: np.ndarray
    event_tokens: np.ndarray
    event_members: np.ndarray
    event_routed: np.ndarray
    event_dense_s: np.ndarray
    event_moe_s: np.ndarray
    step_tokens: np.ndarray
    step_other_s: np.ndarray
    copy_bytes: np.ndarray
    copy_s: np.ndarray
    transfer_s: np.ndarray
    event_decode: np.ndarray | None = None
    step_decode: np.ndarray | None = None

    def __post_init__(self) -> None:
        groups = (("event_layer", "event_tokens", "event_members", "event_routed", "event_dense_s", "event_moe_s"),
                  ("step_tokens", "step_other_s"), ("copy_bytes", "copy_s"))
        for group in groups:
            n = {np.asarray(getattr(self, g)).shape for g in group}
            if len(n) != 1 or len(next(iter(n))) != 1:
                raise ValidationError(f"{', '.join(group)} must be one-dimensional arrays of one length",
                                      field=group[0])
        for name, like in (("event_decode", "event_layer"), ("step_decode", "step_tokens")):
            v = getattr(self, name)
            if v is not None and np.asarray(v).shape != np.asarray(getattr(self, like)).shape:
                raise ValidationError(f"{name} must have one entry per entry of {like}", field=name)
        for f in fields(self):
            if getattr(self, f.name) is None:
                continue
            a = np.asarray(getattr(self, f.name))
            if a.size and (not np.all(np.isfinite(a)) or np.any(a < 0)):
                raise ValidationError(f"{f.name} must be finite and >= 0", field=f.name)

    @classmethod
    def concat(cls, parts: list[CalibrationSpans]) -> CalibrationSpans:
        """The spans of several measurements pooled (e.g. rounds spread over time on a shared machine)."""
        if not parts:
            raise ValidationError("no spans to pool", field="spans")
        out = []
        for f in fields(cls):
            values = [getattr(p, f.name) for p in parts]
            if f.name in ("event_decode", "step_decode"):
                like = "event_layer" if f.name == "event_decode" else "step_tokens"
                values = [np.ones(np.asarray(getattr(p, like)).shape[0], bool) if v is None else v
                          for v, p in zip(values, parts, strict=True)]
            out.append(np.concatenate([np.asarray(v) for v in values]))
        return cls(*out)


def fit_nonnegative(X: np.ndarray, y: np.ndarray, *, robust: bool = True, iterations: int = 50) -> np.ndarray:
    """Coefficients ``w >= 0`` minimising ``sum |X w - y|`` (``robust``) or ``sum (X w - y)^2``.

    Exact for the few columns a profile fit has: every subset of columns is solved by (weighted) least squares
    and the best feasible one kept (non-negative least squares by enumeration); least absolute deviations by
    iteratively reweighted least squares, weights ``1 / max(|r|, 1e-9 * scale)``.

    Parameters
    ----------
    X : float64[n, p]
        Design matrix (``p <= 6``).
    y : float64[n]
        Observations.

    >>> fit_nonnegative(np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]]), np.array([1.0, 3.0, 5.0])).round(9)
    array([1., 2.])
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n, p = X.shape
    if n == 0:
        return np.zeros(p)
    if p > 6:
        raise ValueError("fit_nonnegative enumerates column subsets; at most 6 columns")
    scale = max(float(np.abs(y).max()), 1e-300)
    w = np.ones(n)
    coef = _nnls_weighted(X, y, w)
    if not robust:
        return coef
    for _ in range(iterations):
        r = np.abs(X @ coef - y)
        w = 1.0 / np.maximum(r, 1e-9 * scale)
        new = _nnls_weighted(X, y, w)
        if np.allclose(new, coef, rtol=1e-10, atol=1e-15 * scale):
            coef = new
            break
        coef = new
    return coef


def _nnls_weighted(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    p = X.shape[1]
    sw = np.sqrt(w)
    Xw, yw = X * sw[:, None], y * sw
    best, best_err = np.zeros(p), float(yw @ yw)
    for k in range(1, p + 1):
        for cols in itertools.combinations(range(p), k):
            sol, *_ = np.linalg.lstsq(Xw[:, cols], yw, rcond=None)
            if np.any(sol < 0):
                continue
            coef = np.zeros(p)
            coef[list(cols)] = sol
            r = Xw @ coef - yw
            err = float(r @ r)
            if err < best_err * (1 - 1e-12):
                best, best_err = coef, err
    return best


def _decode(flags: np.ndarray | None, mask: np.ndarray) -> np.ndarray:
    """Within ``mask``: the decode entries, or all of them when there are no flags or no decode entry."""
    if flags is None:
        return np.ones(int(mask.sum()), bool)
    d = np.asarray(flags, bool)[mask]
    return d if d.any() else np.ones(d.shape[0], bool)


def residual_summary(pred: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """``n``, and the median and 90th-percentile absolute relative residual ``|pred - y| / y``."""
    y = np.asarray(y, dtype=np.float64)
    if y.size == 0:
        return {"n": 0, "median_abs_rel": None, "p90_abs_rel": None}
    rel = np.abs(np.asarray(pred) - y) / np.maximum(y, 1e-300)
    return {"n": int(y.size), "median_abs_rel": float(np.median(rel)), "p90_abs_rel": float(np.quantile(rel, 0.9))}


def fit_profile(spans: CalibrationSpans, *, n_layers: int, expert_bytes: int, name: str, source: str,
                overlap: bool, copy_streams: int = 1, extra: dict[str, Any] | None = None) -> HardwareProfile:
    """Fit every cost of a :class:`~expertcache.timing.HardwareProfile` to ``spans`` (see the module docstring).

    Parameters
    ----------
    spans
        The measured spans.
    n_layers
        MoE layers of the model; every layer needs at least one event.
    expert_bytes
        Bytes of one expert block (the profile's ``expert_bytes``).
    name, source
        The profile's name and source.
    overlap
        Whether the executor's copies run concurrently with compute (CUDA) or block it (CPU).
    copy_streams
        Copy channels of the profile.
    extra
        Stored in the profile's ``extra`` beside the fit residuals.

    Raises
    ------
    ValidationError
        A layer without events, no steps, or fewer than two copy sizes.
    """
    s = spans
    dense_fixed, dense_tok, exp_fixed, exp_tok = [], [], [], []
    fit: dict[str, Any] = {"dense": [], "moe": []}
    for l in range(n_layers):
        m = s.event_layer == l
        if not m.any():
            raise ValidationError(f"no calibration event of MoE layer {l}", field="spans")
        tok = s.event_tokens[m].astype(np.float64)
        dec = _decode(s.event_decode, m)
        Xd = np.column_stack([np.ones(tok.shape[0]), tok])
        a, b = fit_nonnegative(Xd[dec], s.event_dense_s[m][dec])
        Xm = np.column_stack([np.ones(tok.shape[0]), s.event_members[m].astype(np.float64),
                              s.event_routed[m].astype(np.float64)])
        c0, c1, c2 = fit_nonnegative(Xm, s.event_moe_s[m])
        dense_fixed.append(float(a + c0))
        dense_tok.append(float(b))
        exp_fixed.append(float(c1))
        exp_tok.append(float(c2))
        fit["dense"].append({"layer": l, "fixed_s": float(a), "per_token_s": float(b),
                             **residual_summary(Xd[dec] @ [a, b], s.event_dense_s[m][dec]),
                             "prefill": residual_summary(Xd[~dec] @ [a, b], s.event_dense_s[m][~dec])})
        fit["moe"].append({"layer": l, "fixed_s": float(c0), "per_member_s": float(c1), "per_routed_token_s":
                           float(c2), **residual_summary(Xm @ [c0, c1, c2], s.event_moe_s[m])})
    if s.step_tokens.shape[0] == 0:
        raise ValidationError("no calibration step", field="spans")
    Xs = np.column_stack([np.ones(s.step_tokens.shape[0]), s.step_tokens.astype(np.float64)])
    dec = _decode(s.step_decode, np.ones(s.step_tokens.shape[0], bool))
    step_fixed, step_tok = fit_nonnegative(Xs[dec], s.step_other_s[dec])
    fit["step"] = {**residual_summary(Xs[dec] @ [step_fixed, step_tok], s.step_other_s[dec]),
                   "prefill": residual_summary(Xs[~dec] @ [step_fixed, step_tok], s.step_other_s[~dec])}
    sizes = np.unique(s.copy_bytes)
    if sizes.shape[0] < 2:
        raise ValidationError("the link fit needs standalone copies of at least two sizes", field="spans")
    Xc = np.column_stack([np.ones(s.copy_bytes.shape[0]), s.copy_bytes.astype(np.float64)])
    lat0, per_byte = fit_nonnegative(Xc, s.copy_s)
    if per_byte <= 0:      # no measurable slope: the larger copy's median rate bounds the bandwidth
        big = s.copy_bytes == sizes[-1]
        per_byte = float(np.median(s.copy_s[big])) / float(sizes[-1])
    bandwidth = 1.0 / per_byte
    fit["link"] = {"standalone_latency_s": float(lat0), "bandwidth": bandwidth,
                   **{f"standalone_median_s_{int(b)}B": float(np.median(s.copy_s[s.copy_bytes == b])) for b in sizes},
                   **residual_summary(Xc @ [lat0, per_byte], s.copy_s)}
    if s.transfer_s.shape[0]:
        med = float(np.median(s.transfer_s))
        latency = max(med - expert_bytes / bandwidth, 0.0)
        fit["link"].update({"executor_transfers": int(s.transfer_s.shape[0]), "executor_transfer_median_s": med})
    else:
        latency = float(lat0)
    fit["link"]["latency_s"] = latency
    return HardwareProfile(
        name=name, source=source, bandwidth=float(bandwidth), latency_s=float(latency),
        copy_streams=int(copy_streams), overlap=bool(overlap), expert_bytes=int(expert_bytes),
        dense_fixed_s=tuple(dense_fixed), dense_per_token_s=tuple(dense_tok), expert_fixed_s=tuple(exp_fixed),
        expert_per_token_s=tuple(exp_tok), step_fixed_s=float(step_fixed), step_per_token_s=float(step_tok),
        measured="measured", extra={**(extra or {}), "fit": fit})
