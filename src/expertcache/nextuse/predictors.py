"""Next-use-distance predictors: the paper's linear model and a gradient-boosted alternative (§7.3).

Both are fitted on one stream's access features and evaluated on a disjoint
one (transfer R² on log next-use distance; never-again accesses excluded from
fit and score). Both save without pickle: the linear model as JSON, the
boosted trees as plain ``.npz`` arrays evaluated by numpy here (scikit-learn is
needed to fit, not to load or predict).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ExpertCacheError, ValidationError
from .features import FEATURE_NAMES, AccessFeatures

__all__ = ["LinearNextUse", "GradientBoostedNextUse", "load_predictor", "transfer_r2"]


def _fit_rows(f: AccessFeatures, max_rows: int | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    ok = ~f.never_again
    X, y = f.X[ok], f.log_next_distance[ok]
    if X.shape[0] == 0:
        raise ValidationError("no access with a next use to fit on (every block is used once)")
    if max_rows is not None and X.shape[0] > max_rows:
        idx = np.sort(np.random.default_rng(seed).choice(X.shape[0], size=max_rows, replace=False))
        X, y = X[idx], y[idx]
    return X, y


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

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Predicted log next-use distance for feature rows ``X``."""
        return ((X - self.mean) / self.scale) @ self.coef + self.intercept

    def save(self, path: str | os.PathLike[str]) -> Path:
        body = {"kind": "linear", "features": list(FEATURE_NAMES), "mean": self.mean.tolist(),
                "scale": self.scale.tolist(), "coef": self.coef.tolist(), "intercept": self.intercept}
        Path(path).write_text(json.dumps(body, indent=2) + "\n")
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

    def predict(self, X: np.ndarray) -> np.ndarray:
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
        path = Path(path)
        with open(path, "wb") as fh:
            np.savez(fh, kind=np.array("gbt"), features=np.array(FEATURE_NAMES),
                     init=np.array(self.init), learning_rate=np.array(self.learning_rate),
                     tree_offsets=self.tree_offsets, left=self.left, right=self.right, feature=self.feature,
                     threshold=self.threshold, value=self.value)
        return path


def load_predictor(path: str | os.PathLike[str]) -> LinearNextUse | GradientBoostedNextUse:
    """Load a saved predictor (JSON linear model or ``.npz`` trees); never unpickles."""
    path = Path(path)
    try:
        if path.suffix == ".json":
            body = json.loads(path.read_text())
            if body.get("kind") != "linear" or body.get("features") != list(FEATURE_NAMES):
                raise ValidationError("not a linear next-use model for these features", source=str(path))
            return LinearNextUse(np.array(body["mean"]), np.array(body["scale"]), np.array(body["coef"]),
                                 float(body["intercept"]))
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise ValidationError("expected a .json linear model or an .npz boosted-tree model", source=str(path))
        with z:
            if str(z["kind"]) != "gbt" or list(z["features"]) != list(FEATURE_NAMES):
                raise ValidationError("not a boosted-tree next-use model for these features", source=str(path))
            return GradientBoostedNextUse(float(z["init"]), float(z["learning_rate"]), z["tree_offsets"], z["left"],
                                          z["right"], z["feature"], z["threshold"], z["value"])
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        if isinstance(exc, ValidationError):
            raise
        raise ValidationError(f"cannot read a next-use model ({exc})", source=str(path)) from None


def transfer_r2(model: LinearNextUse | GradientBoostedNextUse, f: AccessFeatures) -> float:
    """R² of predicted log next-use distance on ``f``'s accesses that have a next use."""
    ok = ~f.never_again
    y = f.log_next_distance[ok]
    pred = model.predict(f.X[ok])
    ss = ((y - y.mean()) ** 2).sum()
    return float(1.0 - ((y - pred) ** 2).sum() / ss) if ss > 0 else 0.0
