"""river's side of the delayed-labels benchmark: ``river_score`` keeps
``evaluate.progressive_val_score``'s order and scores every sample, a classifier's "no answer
yet" as wrong, as the learning benchmark does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bench.delayed_labels import river_score
from bench.learning import STREAMS, load_stream


class LastLabel:
    """Answers the last label it learned: None before the first (as river's trees and forests
    do), or ``before_any`` when given one."""

    def __init__(self, before_any: Any = None) -> None:
        self.last = before_any

    def predict_one(self, _x: dict[str, Any]) -> Any:
        return self.last

    def learn_one(self, _x: dict[str, Any], y: Any) -> None:
        self.last = y


def expected(labels: list[Any], delay: int, before_any: Any, regression: bool) -> float:
    """Sample i is answered with the label of sample i - max(delay, 1): a label falls due
    ``delay`` samples after its own and is learned before the sample it falls due at is
    predicted (with no delay, right after its own prediction)."""
    lag = max(delay, 1)
    scores = []
    for i, y in enumerate(labels):
        answer = labels[i - lag] if i - lag >= 0 else before_any
        scores.append(abs(answer - y) if regression else float(answer is not None and answer == y))
    return float(np.mean(scores))


@pytest.mark.parametrize("delay", [0, 3, 50])
def test_a_classifier_without_an_answer_is_scored_wrong(delay: int) -> None:
    stream = load_stream(STREAMS["phishing"], 120)
    labels = [y for _, y in stream.rows]
    score = river_score(LastLabel, stream, [delay] * len(labels))
    assert score == pytest.approx(expected(labels, delay, None, regression=False))
    # progressive_val_score would score only the answered samples: higher, from fewer samples
    lag = max(delay, 1)
    answered = [labels[i] == labels[i - lag] for i in range(lag, len(labels))]
    assert score < np.mean(answered)


def test_no_delay_and_zero_delays_score_alike() -> None:
    stream = load_stream(STREAMS["phishing"], 80)
    labels = [y for _, y in stream.rows]
    assert river_score(LastLabel, stream, None) == river_score(LastLabel, stream, [0] * 80)
    assert river_score(LastLabel, stream, None) == pytest.approx(
        expected(labels, 0, None, regression=False)
    )


def test_a_regressor_is_scored_by_its_mean_absolute_error_over_every_sample() -> None:
    stream = load_stream(STREAMS["trump"], 90)
    labels = [float(y) for _, y in stream.rows]
    delays = [7] * len(labels)
    score = river_score(lambda: LastLabel(before_any=0.0), stream, delays)
    assert score == pytest.approx(expected(labels, 7, 0.0, regression=True))


def test_per_sample_delays_are_taken_in_order() -> None:
    """A label due later than one after it is learned later: each sample's own delay."""
    stream = load_stream(STREAMS["phishing"], 40)
    rng = np.random.default_rng(0)
    delays = rng.integers(0, 6, size=40).tolist()
    due = {j: j + max(d, 1) for j, d in enumerate(delays)}  # learned before this question
    labels = [y for _, y in stream.rows]
    scores = []
    for i, y in enumerate(labels):
        known = [j for j, at in due.items() if at <= i]
        # LastLabel holds the label learned last: the one due latest; among those learned
        # before the same question, river's queue is in order of j + delay, then of j
        last = max(known, key=lambda j: (due[j], j + delays[j], j)) if known else None
        scores.append(float(last is not None and labels[last] == y))
    assert river_score(LastLabel, stream, delays) == pytest.approx(float(np.mean(scores)))
