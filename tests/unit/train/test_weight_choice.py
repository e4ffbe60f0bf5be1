"""``WeightChoice`` on a real step with weight averaging: which batches are compared, and a
checkpoint's windowed losses restoring the served choice (or, unreadable, leaving the trained
weights served)."""

from __future__ import annotations

import numpy as np
import pytest

from livefit.server.config.model import ModelSettings
from livefit.server.train.modeling import build_compiled, make_loss
from livefit.server.train.train_step import TrainStep
from livefit.server.train.weight_choice import BACKLOG_COMPARISON_EVERY, WeightChoice
from livefit.server.wire.samples import Batch
from tests.unit.train.test_step_graph import step_of


def averaging_choice() -> WeightChoice:
    settings = ModelSettings.model_validate({"input_shape": [3], "output_shape": [1], "seed": 3})
    step = TrainStep(build_compiled(settings, "/CPU:0"), make_loss(settings),
                     settings.input_shape, settings.resolved_target_shape(), "/CPU:0",
                     weight_average=0.99)  # fmt: skip
    assert step.averaging
    return WeightChoice(step)


def batch(rows: int = 8, backlog: int = 0) -> Batch:
    x = np.zeros((rows, 3), np.float32)
    y, w = np.zeros((rows, 1), np.float32), np.ones(rows, np.float32)
    return Batch(x, y, w, 1, None, None, backlog=backlog)


def test_every_caught_up_batch_is_compared_and_one_in_n_of_a_backlog() -> None:
    choice = averaging_choice()
    assert all(choice.start(batch())[0] for _ in range(3))
    compared = [choice.start(batch(backlog=100))[0] for _ in range(3 * BACKLOG_COMPARISON_EVERY)]
    assert sum(compared) == 3
    assert compared[BACKLOG_COMPARISON_EVERY - 1]


def test_an_uncompared_batch_reads_no_averaged_rows_unless_they_are_served() -> None:
    choice = averaging_choice()
    choice.start(batch(backlog=100))  # resets nothing: the first of a backlog is not compared
    compare, rows = choice.start(batch(backlog=100))
    assert not compare and rows == 0
    choice.step.serve_average = True
    compare, rows = choice.start(batch(rows=5, backlog=100))
    assert not compare and rows == 5


def test_a_checkpoint_restores_the_served_choice() -> None:
    choice = averaging_choice()
    choice.trained_loss.add(np.full(100, 2.0))
    choice.average_loss.add(np.full(100, 1.0))
    extra = {**choice.state(), "average_steps": np.asarray(10)}
    again = averaging_choice()
    assert not again.step.serve_average
    again.restore(extra)
    assert again.step.serve_average
    assert again.average_loss.value == 1.0 and again.trained_loss.value == 2.0


def test_an_unreadable_checkpoint_choice_serves_the_trained_weights(
    caplog: pytest.LogCaptureFixture,
) -> None:
    choice = averaging_choice()
    choice.trained_loss.add(np.full(100, 2.0))
    choice.average_loss.add(np.full(100, 1.0))
    extra = {**choice.state(), "average_steps": np.asarray(10)}
    extra["average_choice_averaged"] = np.asarray([[np.nan, -1.0, 3.0]])
    again = averaging_choice()
    again.restore(extra)
    assert not again.step.serve_average
    assert "unreadable" in caplog.text


def test_without_averaging_there_is_no_state() -> None:
    choice = WeightChoice(step_of())
    choice.trained_loss.add(np.full(10, 2.0))
    assert choice.state() == {}
