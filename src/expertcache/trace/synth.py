"""A documented synthetic routing generator for examples and tests.

It is **not** a model: it produces routing with the two properties that make
expert caching interesting, so the pipeline can be exercised before real
traces exist (see ``expertcache collect`` in a later release for those).

* **Skewed popularity**: per layer, expert ``e`` has base weight
  ``1 / (rank(e) + 1) ** zipf_s`` under a random per-layer ranking.
* **Drifting per-request working sets**: each request keeps, per layer, a
  working set of ``working_set`` experts drawn from the popularity; every
  ``drift_every`` tokens a fraction ``drift_fraction`` of it is redrawn. A token
  routes to experts of its working set with a boost of ``affinity`` on their
  logits.
* **Workload categories** (optional, ``n_categories > 0``): request ``r`` belongs
  to category ``r % n_categories``; each category favours its own pool of
  ``working_set`` experts per layer (log-weight boost ``category_affinity``)
  when working sets are drawn, so requests of one category share experts.
  Categories are written to ``provenance["categories"]`` (see
  :mod:`expertcache.trace.labels`); their draws use a separate generator, so
  ``n_categories = 0`` reproduces the plain generator bit for bit.

Selection is a Gumbel top-k over the log-weights (sampling without
replacement); gates are the softmax of the selected perturbed logits. Everything
is drawn from ``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..errors import ValidationError
from .model import DECODE, PREFILL, RoutingTrace

__all__ = ["SynthConfig", "synthesize_trace", "EXAMPLE_CONFIG"]


@dataclass(frozen=True)
class SynthConfig:
    """Parameters of :func:`synthesize_trace` (all documented in the module docstring)."""

    n_layers: int = 16
    n_experts: int = 128
    top_k: int = 8
    n_requests: int = 48
    decode_tokens: int = 96
    prefill_tokens: int = 0
    zipf_s: float = 0.9
    working_set: int = 12
    affinity: float = 2.5
    drift_every: int = 16
    drift_fraction: float = 0.25
    seed: int = 0
    n_categories: int = 0
    category_affinity: float = 3.0

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_experts", "top_k", "n_requests", "decode_tokens", "working_set",
                     "drift_every"):
            if getattr(self, name) < 1:
                raise ValidationError(f"{name} must be >= 1; got {getattr(self, name)}", field=name)
        if self.top_k > self.n_experts or self.working_set > self.n_experts:
            raise ValidationError("top_k and working_set must be <= n_experts", field="top_k")
        if not 0.0 <= self.drift_fraction <= 1.0:
            raise ValidationError(f"drift_fraction must be in [0, 1]; got {self.drift_fraction}",
                                  field="drift_fraction")


def synthesize_trace(config: SynthConfig = SynthConfig()) -> RoutingTrace:
    """Generate a :class:`RoutingTrace` from ``config`` (deterministic in ``config.seed``)."""
    c = config
    rng = np.random.default_rng(c.seed)
    L, N, k = c.n_layers, c.n_experts, c.top_k
    ranks = np.argsort(rng.random((L, N)), axis=1)               # random popularity order per layer
    base = -c.zipf_s * np.log(ranks + 1.0)                         # log-weights, shape (L, N)
    prob = np.exp(base)
    prob /= prob.sum(axis=1, keepdims=True)
    if c.n_categories < 0:
        raise ValidationError(f"n_categories must be >= 0; got {c.n_categories}", field="n_categories")
    cat_prob = None
    if c.n_categories:
        crng = np.random.default_rng([c.seed, 77])
        cat_prob = np.empty((c.n_categories, L, N))
        for j in range(c.n_categories):
            boost = np.zeros((L, N))
            for l in range(L):
                boost[l, crng.choice(N, size=c.working_set, replace=False)] = c.category_affinity
            w = np.exp(base + boost)
            cat_prob[j] = w / w.sum(axis=1, keepdims=True)
    n_tok = c.prefill_tokens + c.decode_tokens
    experts = np.empty((c.n_requests, n_tok, L, k), dtype=np.int16)
    gates = np.empty((c.n_requests, n_tok, L, k), dtype=np.float32)
    for r in range(c.n_requests):
        p_ws = prob if cat_prob is None else cat_prob[r % c.n_categories]
        ws = np.stack([rng.choice(N, size=c.working_set, replace=False, p=p_ws[l]) for l in range(L)])
        for t in range(n_tok):
            if t and t % c.drift_every == 0 and c.drift_fraction > 0:
                n_new = max(1, int(round(c.drift_fraction * c.working_set)))
                for l in range(L):
                    slot = rng.choice(c.working_set, size=n_new, replace=False)
                    keep = np.delete(ws[l], slot)
                    p = prob[l].copy()
                    p[keep] = 0.0
                    p /= p.sum()
                    ws[l, slot] = rng.choice(N, size=n_new, replace=False, p=p)
            logits = base.copy()
            np.put_along_axis(logits, ws, base[np.arange(L)[:, None], ws] + c.affinity, axis=1)
            z = logits + rng.gumbel(size=(L, N))
            top = np.argpartition(-z, k - 1, axis=1)[:, :k]
            zt = np.take_along_axis(z, top, axis=1)
            order = np.argsort(-zt, axis=1)
            top = np.take_along_axis(top, order, axis=1)
            zt = np.take_along_axis(zt, order, axis=1)
            g = np.exp(zt - zt.max(axis=1, keepdims=True))
            experts[r, t] = top
            gates[r, t] = g / g.sum(axis=1, keepdims=True)
    request = np.repeat(np.arange(c.n_requests, dtype=np.int32), n_tok)
    phase = np.tile(np.r_[np.full(c.prefill_tokens, PREFILL), np.full(c.decode_tokens, DECODE)].astype(np.int8),
                    c.n_requests)
    position = np.tile(np.arange(n_tok, dtype=np.int32), c.n_requests)
    ids = tuple(f"synthetic-{r:04d}" for r in range(c.n_requests))
    prov = {"generator": "expertcache.synth", "synthetic": True, "config": asdict(c)}
    if c.n_categories:
        prov["categories"] = {rid: f"category-{r % c.n_categories}" for r, rid in enumerate(ids)}
    return RoutingTrace(
        L, N, k, ids, request, phase, position,
        experts.reshape(-1, L, k), gates.reshape(-1, L, k), np.full(request.shape[0], -1, dtype=np.int64),
        provenance=prov,
    )


#: The configuration of the bundled example trace (OLMoE-1B-7B-shaped: 16 layers, 64 experts, top-8).
EXAMPLE_CONFIG = SynthConfig(n_layers=16, n_experts=64, top_k=8, n_requests=64, decode_tokens=80, prefill_tokens=32,
                             zipf_s=0.8, working_set=12, affinity=2.0, drift_every=16, drift_fraction=0.25,
                             seed=2026)
