"""Next-use prediction (evaluation paper §7.3): features at access time, predictors, and advice for replay.

A predictor never runs inside the replay loop: it produces *advice* — a
predicted next-use unit for every access — and the ``predicted-next-use``
policy substitutes it for the true next use in the same Belady eviction and
bypass-admission machinery.
"""

from .advice import Advice, advice_from_predictions, load_advice, oracle_advice, save_advice
from .features import FEATURE_NAMES, AccessFeatures, access_features
from .predictors import GradientBoostedNextUse, LinearNextUse, load_predictor, transfer_r2

__all__ = ["FEATURE_NAMES", "AccessFeatures", "access_features", "LinearNextUse", "GradientBoostedNextUse",
           "load_predictor", "transfer_r2", "Advice", "advice_from_predictions", "oracle_advice", "save_advice", "load_advice"]
