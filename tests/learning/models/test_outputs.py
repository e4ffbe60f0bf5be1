"""A binary classifier at the user's configuration learns a stream of 2,000 samples, every
prediction it is scored on a probability."""

from __future__ import annotations

import numpy as np

from tests.unit.models.test_outputs import batch, trainer


def test_binary_classifier_scores_probabilities_at_the_users_configuration() -> None:
    """The issue's configuration: shapes and binary cross-entropy, nothing else. Every
    prediction the prequential accuracy and log loss are computed on is a probability."""
    t = trainer(loss="binary_crossentropy")
    scored: list[np.ndarray] = []
    add = t.scores.add

    def recording(losses: np.ndarray, y_true: np.ndarray, y_pred: np.ndarray) -> None:
        scored.append(y_pred)
        add(losses, y_true, y_pred)

    t.scores.add = recording  # type: ignore[method-assign]
    rng = np.random.default_rng(2)
    w = rng.normal(size=(3, 1))
    for _ in range(80):
        x = rng.normal(size=(25, 3)) * 10 + 3
        t.train_batch(batch(x, ((x - 3) @ w > 0).astype(np.float64)))
    predictions = np.concatenate(scored)
    assert predictions.min() >= 0.0 and predictions.max() <= 1.0
    assert t.scores.scores["accuracy"].value > 0.9
