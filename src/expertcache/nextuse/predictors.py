"""Next-use-distance predictors: the paper's linear model and a gradient-boosted alternative (§7.3).

Both are fitted on one stream's access features and evaluated on a disjoint
one (transfer R² on log next-use distance; never-again accesses excluded from
fit and score). Both save without pickle: the linear model as JSON, the
boosted trees as plain ``.npz`` arrays evaluated by numpy here (scikit-learn is
needed to fit, not to load or predict).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ExpertCacheError, ValidationError
from .features import FEATURE_NAMES, AccessFeatures

__all__ = ["LinearNextUse", "GradientBoostedNextUse", "load_predictor", "predict_rows", "transfer_r2"]


#: Rows a prediction takes at a time (both models' ``predict`` and :func:`predict_rows`, by :func:`_in_chunks`): a
#: chunk's standardised copy (4 MiB) where one of every row took 64 bytes a row. A power of two, so that each chunk
#: starts where a block of rows of one BLAS product over every row would: each row's product with the coefficients
#: is the same bits (``tests/test_nextuse.py``).
PREDICT_ROWS = 1 << 16


def _in_chunks(n: int, predict: Callable[[int, int], np.ndarray]) -> np.ndarray:
    """The predictions ``predict(a, b)`` of rows ``a .. b`` of ``n``, :data:`PREDICT_ROWS` rows at a time, in one
    array."""
    out = np.empty(n, dtype=np.float64)
    for a in range(0, n, PREDICT_ROWS):
        b = min(a + PREDICT_ROWS, n)
        out[a:b] = predict(a, b)
    return out


def predict_rows(model: LinearNextUse | GradientBoostedNextUse, X: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``model.predict(X[rows])``, :data:`PREDICT_ROWS` of the rows copied at a time (not all of them at once)."""
    return _in_chunks(rows.shape[0], lambda a, b: model.predict(X[rows[a:b]], overwrite=True))


def _fit_rows(f: AccessFeatures, max_rows: int | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, (int, np.integer))
                                 or max_rows < 1):
        raise ValidationError(f"max_rows must be a positive integer; got {max_rows!r}", field="max_rows")
    rows = np.flatnonzero(~f.never_again)        # the rows with a next use, then the sample of them: only the
    if rows.shape[0] == 0:                         # sampled rows are copied (the same rows as ``X[ok][idx]``)
        raise ValidationError("no access with a next use to fit on (every block is used once)")
    if max_rows is not None and rows.shape[0] > max_rows:
        idx = np.sort(np.random.default_rng(seed).choice(rows.shape[0], size=max_rows, replace=False))
        rows = rows[idx]
    return f.X[rows], f.log_next_distance[rows]


@dataclass(frozen=True)
class LinearNextUse:
    """Least-squares linear model of log next-use distance on standardised features."""

    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float

    @classmethod
    def fit(cls, f: AccessFeatures, max_rows: int | None = None, seed: int = 0) -> LinearNextUse:
        X, y = _fit_rows(f, max_rows, seed)
        mean = X.mean(axis=0)
        scale = X.std(axis=0)
        scale[scale == 0] = 1.0
        Z = np.hstack([(X - mean) / scale, np.ones((X.shape[0], 1))])
        sol, *_ = np.linalg.lstsq(Z, y, rcond=None)
        return cls(mean, scale, sol[:-1], float(sol[-1]))

    def predict(self, X: np.ndarray, overwrite: bool = False) -> np.ndarray:
        """Predicted log next-use distance for feature rows ``X``, :data:`PREDICT_ROWS` rows at a time (a chunk's
        standardised copy, not one of ``X``); ``overwrite``: ``X`` is a copy the caller no longer needs, standardised
        in place."""
        def chunk(a: int, b: int) -> np.ndarray:
            Z = X[a:b]
            if overwrite:
                Z -= self.mean
            else:
                Z = Z - self.mean
            Z /= self.scale                        # in place: one temporary at most, where (X - mean) / scale made two
            return Z @ self.coef

        pred = _in_chunks(X.shape[0], chunk)
        pred += self.intercept
        return pred

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the model as JSON, atomically (a failed write leaves any older file as it was)."""
        from ..storage import atomic_write_bytes, json_text

        body = {"kind": "linear", "features": list(FEATURE_NAMES), "mean": self.mean.tolist(),
                "scale": self.scale.tolist(), "coef": self.coef.tolist(), "intercept": self.intercept}
        atomic_write_bytes(path, (json_text(body, indent=2) + "\n").encode())
        return Path(path)


@dataclass(frozen=True)
class GradientBoostedNextUse:
    """Gradient-boosted regression trees (scikit-learn to fit), stored as flat arrays."""

    init: float
    learning_rate: float
    tree_offsets: np.ndarray     # int64[n_trees + 1], node ranges of each tree
    left: np.ndarray             # int64[n_nodes], -1 at leaves (indices local to the tree)
    right: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    value: np.ndarray

    @classmethod
    def fit(cls, f: AccessFeatures, n_estimators: int = 100, max_depth: int = 3, learning_rate: float = 0.1,
            max_rows: int | None = 200_000, seed: int = 0) -> GradientBoostedNextUse:
        try:
            from sklearn.ensemble import GradientBoostingRegressor
        except ImportError:
            raise ExpertCacheError("fitting boosted trees needs scikit-learn: pip install 'expertcache[nextuse]'") \
                from None
        X, y = _fit_rows(f, max_rows, seed)
        model = GradientBoostingRegressor(n_estimators=n_estimators, max_depth=max_depth,
                                          learning_rate=learning_rate, subsample=0.8, random_state=seed)
        model.fit(X, y)
        trees = [est[0].tree_ for est in model.estimators_]
        sizes = [t.node_count for t in trees]
        offsets = np.zeros(len(trees) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        return cls(float(model.init_.constant_.ravel()[0]), float(learning_rate), offsets,
                   np.concatenate([t.children_left for t in trees]).astype(np.int64),
                   np.concatenate([t.children_right for t in trees]).astype(np.int64),
                   np.concatenate([t.feature for t in trees]).astype(np.int64),
                   np.concatenate([t.threshold for t in trees]).astype(np.float64),
                   np.concatenate([t.value[:, 0, 0] for t in trees]).astype(np.float64))

    def predict(self, X: np.ndarray, overwrite: bool = False) -> np.ndarray:
        """Predicted log next-use distance for feature rows ``X`` (``overwrite`` as :meth:`LinearNextUse.predict`'s;
        the trees only read ``X``), :data:`PREDICT_ROWS` rows at a time (a walk holds several arrays of its rows)."""
        return _in_chunks(X.shape[0], lambda a, b: self._predict(X[a:b]))

    def _predict(self, X: np.ndarray) -> np.ndarray:
        out = np.full(X.shape[0], self.init)
        rows = np.arange(X.shape[0])
        for j in range(self.tree_offsets.shape[0] - 1):
            o = self.tree_offsets[j]
            node = np.zeros(X.shape[0], dtype=np.int64)
            while True:
                inner = self.left[o + node] >= 0
                if not inner.any():
                    break
                idx = rows[inner]
                n = node[inner]
                go_left = X[idx, self.feature[o + n]] <= self.threshold[o + n]
                node[inner] = np.where(go_left, self.left[o + n], self.right[o + n])
            out += self.learning_rate * self.value[o + node]
        return out

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the trees as plain ``.npz`` arrays, atomically."""
        from ..storage import atomic_file

        path = Path(path)
        with atomic_file(path) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, kind=np.array("gbt"), features=np.array(FEATURE_NAMES),
                     init=np.array(self.init), learning_rate=np.array(self.learning_rate),
                     tree_offsets=self.tree_offsets, left=self.left, right=self.right, feature=self.feature,
                     threshold=self.threshold, value=self.value)
        return path


#: Bounds a loaded boosted-tree model must respect (checked before :meth:`GradientBoostedNextUse.predict`).
MAX_TREE_DEPTH = 64
MAX_TREES = 100_000


def load_predictor(path: str | os.PathLike[str]) -> LinearNextUse | GradientBoostedNextUse:
    """Load a saved predictor (JSON linear model or ``.npz`` trees); never unpickles.

    Everything is validated at load: the linear model's arrays (one finite number per feature), the
    trees' structure (node indices in range, every child after its parent so no cycle, depth at most
    :data:`MAX_TREE_DEPTH`, feature indices in range, finite thresholds and values), so prediction
    always terminates.
    """
    from ..jsonl import read_json
    from ..storage import read_npz

    path = Path(path)
    src = str(path)
    if path.suffix == ".json":
        body = read_json(path, "a linear next-use model")
        if not isinstance(body, dict) or body.get("kind") != "linear" or body.get("features") != list(FEATURE_NAMES):
            raise ValidationError("not a linear next-use model for these features", source=src)
        d = len(FEATURE_NAMES)
        arrays = {}
        for name in ("mean", "scale", "coef"):
            v = body.get(name)
            if not isinstance(v, list) or len(v) != d or \
                    any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in v):
                raise ValidationError(f"expected {d} numbers (one per feature)", source=src, field=name)
            arr = np.array(v, dtype=np.float64)
            if not np.isfinite(arr).all() or (name == "scale" and (arr == 0).any()):
                raise ValidationError("expected finite numbers" + (", non-zero" if name == "scale" else ""),
                                      source=src, field=name)
            arrays[name] = arr
        b = body.get("intercept")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not np.isfinite(b):
            raise ValidationError(f"expected a finite number; got {str(b)[:40]}", source=src, field="intercept")
        return LinearNextUse(arrays["mean"], arrays["scale"], arrays["coef"], float(b))
    try:
        z = read_npz(path, required=("kind", "features", "init", "learning_rate", "tree_offsets", "left", "right",
                                     "feature", "threshold", "value"))
    except ValidationError as exc:
        raise ValidationError(f"cannot read a next-use model: {exc.detail}; expected a .json linear model or an "
                              ".npz boosted-tree model", source=src, field=exc.field) from None
    if z["kind"].shape != () or str(z["kind"]) != "gbt" or z["features"].ndim != 1 or \
            list(z["features"]) != list(FEATURE_NAMES):
        raise ValidationError("not a boosted-tree next-use model for these features", source=src)
    return _validated_trees(z, src)


def _validated_trees(z: dict[str, np.ndarray], src: str) -> GradientBoostedNextUse:
    """Check the flat tree arrays (see :func:`load_predictor`) and build the model."""
    scalars = {}
    for name in ("init", "learning_rate"):
        a = z[name]
        if a.shape != () or a.dtype.kind not in "fiu" or not np.isfinite(a):
            raise ValidationError("expected a finite scalar", source=src, field=name)
        scalars[name] = float(a)
    for name in ("tree_offsets", "left", "right", "feature"):
        if z[name].ndim != 1 or z[name].dtype.kind not in "iu":
            raise ValidationError(f"expected a 1-D integer array; got {z[name].dtype} {z[name].shape}",
                                  source=src, field=name)
    for name in ("threshold", "value"):
        if z[name].ndim != 1 or z[name].dtype.kind != "f":
            raise ValidationError(f"expected a 1-D float array; got {z[name].dtype} {z[name].shape}",
                                  source=src, field=name)
    off = z["tree_offsets"].astype(np.int64)
    left, right, feature = (z[n].astype(np.int64) for n in ("left", "right", "feature"))
    threshold, value = z["threshold"].astype(np.float64), z["value"].astype(np.float64)
    n = left.shape[0]
    for name, a in (("right", right), ("feature", feature), ("threshold", threshold), ("value", value)):
        if a.shape[0] != n:
            raise ValidationError(f"expected {n} entries (one per node, as 'left'); got {a.shape[0]}", source=src,
                                  field=name)
    if off.shape[0] < 2 or off.shape[0] - 1 > MAX_TREES or off[0] != 0 or off[-1] != n or (np.diff(off) < 1).any():
        raise ValidationError(f"expected increasing node offsets from 0 to {n}, at most {MAX_TREES} trees",
                              source=src, field="tree_offsets")
    tree = np.repeat(np.arange(off.shape[0] - 1), np.diff(off))
    local = np.arange(n) - off[tree]
    size = np.diff(off)[tree]
    leaf = left < 0
    bad = _first_true((leaf != (right < 0)) | (leaf & ((left != -1) | (right != -1))))
    if bad is not None:
        raise ValidationError(f"node {bad}: a leaf has left = right = -1, an inner node two children",
                              source=src, field="left")
    for name, child in (("left", left), ("right", right)):
        bad = _first_true(~leaf & ((child <= local) | (child >= size)))
        if bad is not None:
            raise ValidationError(f"node {bad}: child {child[bad]} must come after its parent inside its tree "
                                  f"(local index in ({local[bad]}, {size[bad]})): no cycles", source=src,
                                  field=name)
    bad = _first_true(~leaf & ((feature < 0) | (feature >= len(FEATURE_NAMES)) | ~np.isfinite(threshold)))
    if bad is not None:
        raise ValidationError(f"node {bad}: feature index must be in [0, {len(FEATURE_NAMES)}) with a finite "
                              "threshold", source=src, field="feature")
    bad = _first_true(leaf & ~np.isfinite(value))
    if bad is not None:
        raise ValidationError(f"node {bad}: leaf values must be finite", source=src, field="value")
    frontier = off[:-1].copy()                  # the roots, global indices; children come after parents
    for _ in range(MAX_TREE_DEPTH + 1):
        frontier = frontier[~leaf[frontier]]
        if frontier.size == 0:
            break
        frontier = np.unique(np.concatenate([off[tree[frontier]] + left[frontier],
                                             off[tree[frontier]] + right[frontier]]))
    else:
        raise ValidationError(f"a tree is deeper than {MAX_TREE_DEPTH} levels", source=src, field="left")
    return GradientBoostedNextUse(scalars["init"], scalars["learning_rate"], off, left, right, feature, threshold,
                                  value)


def _first_true(mask: np.ndarray) -> int | None:
    idx = np.flatnonzero(mask)
    return int(idx[0]) if idx.size else None


def transfer_r2(model: LinearNextUse | GradientBoostedNextUse, f: AccessFeatures) -> float:
    """R² of predicted log next-use distance on ``f``'s accesses that have a next use."""
    rows = np.flatnonzero(~f.never_again)
    y = f.log_next_distance[rows]
    d = y - y.mean()                               # the squares in place: the values of ((y - y.mean()) ** 2),
    d **= 2                                        # summed the same way
    ss = d.sum()
    del d
    pred = predict_rows(model, f.X, rows)          # a chunk of the rows copied at a time, not all of them
    np.subtract(y, pred, out=pred)
    pred **= 2
    return float(1.0 - pred.sum() / ss) if ss > 0 else 0.0
