"""Lookahead prefetch in the style of ProMoE: a small learned predictor from layer ``l`` to layer ``l + d``.

ProMoE runs a learned predictor on the hidden state at layer ``l`` to guess
the experts of layer ``l + d`` and prefetches them while layers ``l .. l+d-1``
compute. Here the predictor is a ridge-regularised linear map per target
layer (closed form, numpy), fitted on a calibration trace from the feature of
each token at layer ``l`` to the multi-hot of its experts at ``l + d``:

* feature = the collected hidden state entering MoE block ``l``
  (``expertcache.collect.read_array(trace_dir, "hidden")``) when available;
* otherwise the routing itself (multi-hot of the experts at layer ``l``) —
  a routing-derived stand-in, labelled as such in every output.

Per-token scores for layer ``l + d`` are summed over the event's active
requests into ``prefetch_score``; the first ``d`` layers of a token have no
candidates. Retention stays LRU (ProMoE keeps a conventional cache).
"""

from __future__ import annotations

import numpy as np

from ..errors import ValidationError
from ..trace import RoutingTrace
from .context import AdviceContext
from .produced import Produced, multi_hot

__all__ = ["LookaheadPredictor", "fit_lookahead", "lookahead"]


class LookaheadPredictor:
    """Linear maps ``W[l']``: feature at layer ``l' - d`` -> expert scores at layer ``l'`` (with bias).

    Attributes
    ----------
    distance
        ``d``.
    weights
        ``{target_layer: float32[F + 1, N]}`` (last row = bias).
    feature
        ``"hidden"`` or ``"routing"``.
    """

    def __init__(self, distance: int, weights: dict[int, np.ndarray], feature: str) -> None:
        self.distance = distance
        self.weights = weights
        self.feature = feature

    @property
    def n_params(self) -> int:
        """Added inference-time parameters (all maps, biases included)."""
        return int(sum(w.size for w in self.weights.values()))

    def predict(self, features: np.ndarray, target_layer: int) -> np.ndarray:
        """``float32[n, N]`` scores for ``target_layer`` from ``features`` (``[n, F]``) at ``target_layer - d``."""
        w = self.weights[target_layer]
        return (features.astype(np.float32) @ w[:-1] + w[-1]).astype(np.float32)


def _features(trace: RoutingTrace, hidden: np.ndarray | None, rows: np.ndarray, layer: int) -> np.ndarray:
    if hidden is not None:
        return hidden[rows, layer].astype(np.float32)
    return multi_hot(trace.experts[rows, layer], trace.n_experts)


def _routing_normal_equations(trace: RoutingTrace, src: int, target: int) -> tuple[np.ndarray, np.ndarray]:
    """``X^T X`` and ``X^T Y`` for X = [multi-hot at ``src``, 1] and Y = multi-hot at ``target``, by counting.

    The entries are co-occurrence counts (expert ids of one token and layer are
    distinct), so this equals the dense product exactly without building ``X``.
    """
    from ._kernels import pair_counts

    N = trace.n_experts
    a = np.ascontiguousarray(trace.experts[:, src])                          # [n, k]
    b = np.ascontiguousarray(trace.experts[:, target])
    aa = np.zeros(N * N, dtype=np.int64)
    ab = np.zeros(N * N, dtype=np.int64)
    pair_counts(a, b, N, aa, ab)
    count_a = np.bincount(a.ravel().astype(np.int64), minlength=N).astype(np.float64)
    gram = np.empty((N + 1, N + 1), dtype=np.float64)
    gram[:N, :N] = aa.reshape(N, N)
    gram[:N, N] = gram[N, :N] = count_a
    gram[N, N] = trace.n_tokens
    xty = np.empty((N + 1, N), dtype=np.float64)
    xty[:N] = ab.reshape(N, N)
    xty[N] = np.bincount(b.ravel().astype(np.int64), minlength=N)
    return gram, xty


def fit_lookahead(calibration: RoutingTrace, distance: int = 3, hidden: np.ndarray | None = None,
                  ridge: float = 1e-2, chunk: int = 8192) -> LookaheadPredictor:
    """Fit one ridge map per target layer ``l' >= d`` on every calibration row.

    ``ridge`` is relative: the penalty is ``ridge * mean(diag(X^T X))``.
    """
    L, N = calibration.n_layers, calibration.n_experts
    if isinstance(distance, bool) or not isinstance(distance, (int, np.integer)) or not 1 <= distance < L:
        raise ValidationError(f"lookahead distance must be in [1, L) = [1, {L}); got {distance!r}", field="lookahead")
    if hidden is not None and (hidden.ndim != 3 or hidden.shape[:2] != (calibration.n_tokens, L)):
        raise ValidationError(f"hidden states must be [n_tokens, L, d_model] = [{calibration.n_tokens}, {L}, ...]; "
                              f"got {hidden.shape}", field="hidden")
    weights = {}
    for target in range(distance, L):
        if hidden is None:
            gram, xty = _routing_normal_equations(calibration, target - distance, target)
            pen = ridge * max(float(np.mean(np.diag(gram))), 1e-12)
            weights[target] = np.linalg.solve(gram + pen * np.eye(gram.shape[0]), xty).astype(np.float32)
            continue
        # normal equations accumulated over row chunks: memory O(chunk * F + F^2)
        gram = xty = None
        for lo in range(0, calibration.n_tokens, chunk):
            rows = np.arange(lo, min(lo + chunk, calibration.n_tokens))
            x = _features(calibration, hidden, rows, target - distance).astype(np.float64)
            x = np.hstack([x, np.ones((x.shape[0], 1))])
            y = multi_hot(calibration.experts[rows, target], N).astype(np.float64)
            gram = x.T @ x if gram is None else gram + x.T @ x
            xty = x.T @ y if xty is None else xty + x.T @ y
        pen = ridge * max(float(np.mean(np.diag(gram))), 1e-12)
        weights[target] = np.linalg.solve(gram + pen * np.eye(gram.shape[0]), xty).astype(np.float32)
    return LookaheadPredictor(int(distance), weights, "hidden" if hidden is not None else "routing")


def lookahead(ctx: AdviceContext, calibration: RoutingTrace, distance: int = 3, hidden: np.ndarray | None = None,
              hidden_calibration: np.ndarray | None = None, chunk: int = 8192) -> Produced:
    """ProMoE-style prefetch advice for ``ctx`` (see the module docstring); ``hidden`` rows align with ``ctx.trace``."""
    if (hidden is None) != (hidden_calibration is None):
        raise ValidationError("pass hidden states for both the evaluated and the calibration trace, or neither",
                              field="hidden")
    model = fit_lookahead(calibration, distance, hidden_calibration)
    pf = ctx.empty()
    for target in range(distance, ctx.trace.n_layers):
        for lo in range(0, ctx.n_exec, chunk):
            x = np.arange(lo, min(lo + chunk, ctx.n_exec))
            feats = _features(ctx.trace, hidden, ctx.exec_row[x], target - distance)
            ctx.scatter(pf, target, model.predict(feats, target), rows=x)
    adv = ctx.advice(None, pf, {"producer": "lookahead (ProMoE style)", "distance": distance,
                                "feature": model.feature})
    note = ("hidden state at l -> experts at l+d, linear ridge predictor" if model.feature == "hidden" else
            "no hidden states in the trace: routing at l (multi-hot) -> experts at l+d, a routing-derived stand-in")
    return Produced(adv, "lru", True, added_params=model.n_params, availability=f"Prev. layer (l-{distance})",
                    note=note, details={"feature": model.feature, "distance": distance})
