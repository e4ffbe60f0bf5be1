"""The peers: river's per-sample learners, test-then-train one sample at a time."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.learning.scores import Score
from bench.learning.streams import BINARY, MULTICLASS, REGRESSION, Stream

LR = "logistic regression"
SOFTMAX = "softmax regression"
LINREG = "linear regression"
LINREG_TSS = "linear regression, standardized target"
HT = "Hoeffding tree"
HAT = "Hoeffding adaptive tree"
ARF = "adaptive random forest"
PEER_SEED = 42  # the randomised peers (ARF) are seeded, so their figures repeat
EPS = 1e-7  # probabilities are clipped to [EPS, 1 - EPS] for log loss, as livefit does
REFERENCE = {BINARY: LR, MULTICLASS: SOFTMAX, REGRESSION: LINREG}  # the per-sample linear model
CONTENDERS = ("linear", HAT, ARF)  # issue #30's three kinds of peer


def contender_kind(peer: str) -> str | None:
    """Which of issue #30's three kinds a peer is (its linear models count as one)."""
    if peer in CONTENDERS:
        return peer
    if "regression" in peer:
        return "linear"
    return None


def logistic_regression() -> Any:
    from river import linear_model, preprocessing

    return preprocessing.StandardScaler() | linear_model.LogisticRegression()


def _softmax_regression() -> Any:
    from river import linear_model, preprocessing

    return preprocessing.StandardScaler() | linear_model.SoftmaxRegression()


def _hoeffding_tree() -> Any:
    from river import tree

    return tree.HoeffdingTreeClassifier()


def _hoeffding_adaptive_tree() -> Any:
    from river import tree

    return tree.HoeffdingAdaptiveTreeClassifier(seed=PEER_SEED)


def _adaptive_random_forest() -> Any:
    from river import forest

    return forest.ARFClassifier(seed=PEER_SEED)


def _hoeffding_adaptive_tree_regressor() -> Any:
    from river import preprocessing, tree

    return preprocessing.StandardScaler() | tree.HoeffdingAdaptiveTreeRegressor(seed=PEER_SEED)


def _adaptive_random_forest_regressor() -> Any:
    from river import forest, preprocessing

    return preprocessing.StandardScaler() | forest.ARFRegressor(seed=PEER_SEED)


def _linear_regression() -> Any:
    from river import linear_model, preprocessing

    return preprocessing.StandardScaler() | linear_model.LinearRegression()


def _linear_regression_tss() -> Any:
    from river import preprocessing

    return preprocessing.TargetStandardScaler(regressor=_linear_regression())


def _hoeffding_tree_regressor() -> Any:
    from river import preprocessing, tree

    return preprocessing.StandardScaler() | tree.HoeffdingTreeRegressor()


PeerTable = dict[str, tuple[str, Callable[[], Any]]]
PEERS: dict[str, PeerTable] = {
    BINARY: {
        LR: ("`preprocessing.StandardScaler() | linear_model.LogisticRegression()`",
             logistic_regression),
        HT: ("`tree.HoeffdingTreeClassifier()`", _hoeffding_tree),
        HAT: ("`tree.HoeffdingAdaptiveTreeClassifier(seed=42)`", _hoeffding_adaptive_tree),
        ARF: ("`forest.ARFClassifier(seed=42)`", _adaptive_random_forest),
    },
    MULTICLASS: {
        SOFTMAX: ("`preprocessing.StandardScaler() | linear_model.SoftmaxRegression()`",
                  _softmax_regression),
        HT: ("`tree.HoeffdingTreeClassifier()`", _hoeffding_tree),
        HAT: ("`tree.HoeffdingAdaptiveTreeClassifier(seed=42)`", _hoeffding_adaptive_tree),
        ARF: ("`forest.ARFClassifier(seed=42)`", _adaptive_random_forest),
    },
    REGRESSION: {
        LINREG: ("`preprocessing.StandardScaler() | linear_model.LinearRegression()`",
                 _linear_regression),
        LINREG_TSS: ("`preprocessing.TargetStandardScaler(regressor=StandardScaler() | "
                     "LinearRegression())`", _linear_regression_tss),
        HT: ("`preprocessing.StandardScaler() | tree.HoeffdingTreeRegressor()`",
             _hoeffding_tree_regressor),
        HAT: ("`preprocessing.StandardScaler() | tree.HoeffdingAdaptiveTreeRegressor(seed=42)`",
              _hoeffding_adaptive_tree_regressor),
        ARF: ("`preprocessing.StandardScaler() | forest.ARFRegressor(seed=42)`",
              _adaptive_random_forest_regressor),
    },
}  # fmt: skip


def peer_score(make_model: Callable[[], Any], stream: Stream) -> Score:
    """Test-then-train, one sample at a time: predict, then ``learn_one``.

    A classifier's prediction is river's most probable class (none before the model has seen
    a class, which counts as wrong: ``evaluate.progressive_val_score`` would leave that sample
    out, where livefit answers and is scored on every sample); a regressor's is
    ``predict_one``.
    """
    if stream.task == REGRESSION:
        return _peer_regression(make_model(), stream)
    model = make_model()
    correct = np.zeros(len(stream), dtype=np.float32)
    loss = 0.0
    uniform = 1.0 / len(stream.classes)
    started = time.perf_counter()
    for i, (x, y) in enumerate(stream.rows):
        proba = model.predict_proba_one(x)
        predicted = max(proba, key=proba.get) if proba else None
        correct[i] = predicted == y
        loss += _log_loss(proba.get(y, 0.0) if proba else uniform)
        model.learn_one(x, y)
    seconds = time.perf_counter() - started
    return Score(
        float(correct.mean()), loss / len(stream), len(stream), seconds, per_sample=correct
    )


def _peer_regression(model: Any, stream: Stream) -> Score:
    errors = np.zeros(len(stream), dtype=np.float64)
    started = time.perf_counter()
    for i, (x, y) in enumerate(stream.rows):
        errors[i] = abs(float(model.predict_one(x)) - y)
        model.learn_one(x, y)
    seconds = time.perf_counter() - started
    return Score(
        math.nan, math.nan, len(stream), seconds, per_sample=errors,
        mae=float(errors.mean()), rmse=float(np.sqrt(np.square(errors).mean())),
    )  # fmt: skip


def _log_loss(p_true: float) -> float:
    return -math.log(min(max(p_true, EPS), 1 - EPS))


def peer_scores(stream: Stream) -> dict[str, Score]:
    return {name: peer_score(make, stream) for name, (_, make) in PEERS[stream.task].items()}
