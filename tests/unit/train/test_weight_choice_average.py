"""``train.weight_average``: an exponential moving average of the trained weights, served (and
scored) while its recent prequential loss is lower than the trained weights'; checkpoints keep
the trained weights and the average."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from livefit.server.config.model import ModelSettings
from livefit.server.storage.checkpoint import CheckpointStore
from livefit.server.train.prequential import WindowedMean
from livefit.server.train.train_step import StepResult
from livefit.server.train.trainer import Trainer
from tests.unit.train.test_update_policy import batch, trainer


def debiased_average(trajectory: list[list[np.ndarray]], start: list[np.ndarray], decay: float):
    """The average the step keeps: decay min(``decay``, t / (9 + t)) at the t-th update."""
    mean = [np.array(w, dtype=np.float64) for w in start]
    for t, weights in enumerate(trajectory, start=1):
        d = min(decay, t / (9 + t))
        mean = [d * m + (1 - d) * w for m, w in zip(mean, weights, strict=True)]
    return mean


def test_on_by_default_and_off_serves_the_trained_weights() -> None:
    assert ModelSettings(input_shape=[3], output_shape=[1]).train.weight_average == 0.95
    t = trainer(train={"weight_average": 0.0})
    t.train_batch(batch(np.ones((4, 3))))
    snapshot = t.snapshots.take(force=True)
    assert snapshot is not None
    for served, trained in zip(snapshot.weights, t.model.get_weights(), strict=True):
        np.testing.assert_array_equal(served, trained)
    assert t.policy.state().keys().isdisjoint({"average_steps", "average_0"})
    assert t.policy.learn(batch(np.ones((4, 3)))).first.average_losses is None


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5])
def test_the_decay_is_below_one(bad: float) -> None:
    with pytest.raises(ValueError):
        ModelSettings(input_shape=[3], output_shape=[1], train={"weight_average": bad})


def test_served_average_is_in_snapshots_and_scores() -> None:
    t = trainer(train={"weight_average": 0.5, "start_lr_factor": 1}, learning_rate=0.1)
    rng = np.random.default_rng(1)
    start = [np.array(v.numpy()) for v in t.model.trainable_variables]
    trajectory = []
    for _ in range(6):  # one step a batch (backlog): one update of the average each
        t.train_batch(batch(rng.normal(size=(8, 3)), backlog=1))
        trajectory.append([np.array(v.numpy()) for v in t.model.trainable_variables])
    expected = debiased_average(trajectory, start, 0.5)
    t.step.serve_average = True  # as if the average had done better (see the next test)
    snapshot = t.snapshots.take(force=True)
    assert snapshot is not None
    served = [snapshot.weights[i] for i, v in enumerate(t.model.weights) if v.trainable]
    for got, want in zip(served, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(served[0], t.model.get_weights()[0])  # not the trained ones
    # The next batch is scored with the averaged weights: what a client would have got.
    x = rng.normal(size=(8, 3)).astype(np.float32)
    other = trainer()
    other.model.set_weights(list(snapshot.weights))
    want_pred = np.asarray(other.model(x))
    learned = t.policy.learn(batch(x, backlog=1))
    np.testing.assert_allclose(learned.first.predictions, want_pred, rtol=1e-5, atol=1e-6)
    assert learned.first.average_predictions is not None


def result(trained: float, averaged: float) -> StepResult:
    n = 4
    return StepResult(
        0.0, np.full(n, trained), np.zeros((n, 1)), True, np.full(n, averaged), np.ones((n, 1))
    )


def test_the_weights_with_the_lower_windowed_loss_are_served() -> None:
    t = trainer(train={"weight_average": 0.9})
    policy = t.policy
    assert not t.step.serve_average  # the trained weights until the average did better
    first = policy.choice.choose(result(1.0, 0.5))  # scored with the trained weights
    np.testing.assert_array_equal(first.predictions, np.zeros((4, 1)))
    assert t.step.serve_average  # the average did better: served from now on
    second = policy.choice.choose(result(1.0, 2.0))
    np.testing.assert_array_equal(second.predictions, np.ones((4, 1)))  # the average's
    np.testing.assert_array_equal(second.prequential_losses, np.full(4, 2.0))
    assert not t.step.serve_average  # windowed means: 1.25 (averaged) against 1.0
    served = t.snapshots.take(force=True)
    assert served is not None
    for got, want in zip(served.weights, t.model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_checkpoints_keep_trained_weights_and_the_average(tmp_path: Path) -> None:
    settings = {"train": {"weight_average": 0.9}}
    t = trainer(tmp_path, **settings)
    rng = np.random.default_rng(2)
    for _ in range(4):
        t.train_batch(batch(rng.normal(size=(8, 3))))
    trained = t.model.get_weights()
    t.step.serve_average = True
    served = t.snapshots.take(force=True).weights  # type: ignore[union-attr]
    t.checkpointing.save_if_due(final=True)
    restored = trainer(tmp_path, **settings)
    for got, want in zip(restored.model.get_weights(), trained, strict=True):
        np.testing.assert_array_equal(got, want)
    restored.step.serve_average = True
    for got, want in zip(restored.step.served_weights(), served, strict=True):
        np.testing.assert_array_equal(got, want)
    assert float(restored.step._averaged.numpy()) == float(t.step._averaged.numpy())


def test_a_checkpoint_without_an_average_restarts_it_from_the_weights(tmp_path: Path) -> None:
    t = trainer(tmp_path, train={"weight_average": 0.0})
    t.train_batch(batch(np.ones((4, 3))))
    t.checkpointing.save_if_due(final=True)
    restored = trainer(tmp_path, train={"weight_average": 0.9})
    restored.step.serve_average = True
    for got, want in zip(restored.step.served_weights(), t.model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_drift_reaction_restarts_the_average() -> None:
    t = trainer(train={"weight_average": 0.99}, drift={"reaction": "flush_replay"})
    rng = np.random.default_rng(3)
    for _ in range(3):
        t.train_batch(batch(rng.normal(size=(8, 3))))
    t.policy.drift._detector.update = lambda losses: [0]  # type: ignore[method-assign]
    t.train_batch(batch(rng.normal(size=(8, 3))))
    t.step.serve_average = True
    for got, want in zip(t.step.served_weights(), t.model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_without_averaging_a_drift_reaction_and_a_restore_work(tmp_path: Path) -> None:
    t = trainer(tmp_path, drift={"reaction": "flush_replay"})
    t.train_batch(batch(np.ones((4, 3))))
    t.policy.drift._detector.update = lambda losses: [0]  # type: ignore[method-assign]
    t.train_batch(batch(np.ones((4, 3))))
    assert t.policy.drift.detections == 1
    t.checkpointing.save_if_due(final=True)
    restored = trainer(tmp_path)
    assert restored.restored_from is not None


def test_a_restart_serves_what_the_checkpoint_served(tmp_path: Path) -> None:
    """The windowed losses that chose the served weights travel in the checkpoint: a restored
    trainer serves the average where it did better (it used to serve the trained weights until
    a batch of its own, then choose from that batch's losses alone) and goes on choosing from
    the same window."""
    settings = {"train": {"weight_average": 0.9}}
    t = trainer(tmp_path, **settings)
    t.train_batch(batch(np.ones((4, 3))))  # the first step: both weights score alike (L)
    t.policy.choice.choose(result(1.0, 0.5))  # windows: trained 4 L + 4, averaged 4 L + 2
    assert t.step.serve_average
    served = t.snapshots.take(force=True).weights  # type: ignore[union-attr]
    t.checkpointing.save_if_due(final=True)
    restored = trainer(tmp_path, **settings)
    assert restored.step.serve_average
    handed = restored.slot.latest  # what warm_up handed to serving
    assert handed is not None
    for got, want in zip(handed.weights, served, strict=True):
        np.testing.assert_array_equal(got, want)
    # A batch on which the trained weights do better: alone it would switch to them, with
    # the restored window (4 L + 6 against 4 L + 5.2) the average stays served.
    fresh = trainer(tmp_path / "fresh", **settings)
    fresh.policy.choice.choose(result(0.5, 0.8))
    assert not fresh.step.serve_average
    restored.policy.choice.choose(result(0.5, 0.8))
    assert restored.step.serve_average


def test_the_choice_window_round_trips() -> None:
    mean = WindowedMean(10)
    for values in ([1.0, 2.0], [3.0] * 5, [4.0] * 6):
        mean.add(np.array(values))
    again = WindowedMean.from_batches(10, mean.batches())
    assert again.value == mean.value
    again.add(np.array([5.0] * 3))
    mean.add(np.array([5.0] * 3))
    assert again.value == mean.value
    assert np.isnan(WindowedMean.from_batches(10, WindowedMean(10).batches()).value)


HOSTILE_CHOICES = {
    "a NaN count": np.array([[1.0, np.nan]]),
    "an infinite count": np.array([[1.0, np.inf]]),
    "a negative count": np.array([[1.0, -4.0]]),
    "a zero count": np.array([[1.0, 0.0]]),
    "a fractional count": np.array([[1.0, 0.5]]),
    "a count past the window": np.array([[1.0, 2.0**62]]),
    "a NaN sum": np.array([[np.nan, 4.0]]),
    "an odd number of values": np.array([1.0, 2.0, 3.0]),
    "more pairs than the window holds": np.ones((5000, 2)),
    "integers past float64's range": np.array([[10**18, 2**63 - 1]], dtype=np.int64),
}


@pytest.fixture(scope="module")
def served_average_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Trainer, Path]:
    """A trainer that serves its average, and the directory of its final checkpoint: trained
    once for every hostile case below, which each corrupt a copy of the checkpoint."""
    directory = tmp_path_factory.mktemp("served_average")
    t = trainer(directory, train={"weight_average": 0.9})
    t.train_batch(batch(np.ones((4, 3))))
    t.policy.choice.choose(result(1.0, 0.5))
    assert t.step.serve_average
    t.checkpointing.save_if_due(final=True)
    return t, directory


@pytest.mark.parametrize("name", sorted(HOSTILE_CHOICES))
def test_a_checkpoint_with_an_unreadable_choice_restores_and_serves_the_trained_weights(
    tmp_path: Path, name: str, served_average_checkpoint: tuple[Trainer, Path]
) -> None:
    """The windows that choose the served weights are checked, not trusted: a checkpoint that
    passes its checksum with nonsense in them (a bug, or a file written by hand) restores the
    model, the average and the scalers, serves the trained weights and goes on learning; it
    used to raise from inside the restore (a NaN count) or build a window that never drains."""
    settings = {"train": {"weight_average": 0.9}}
    t, trained = served_average_checkpoint
    directory = tmp_path / "checkpoints"
    shutil.copytree(trained, directory)
    store = CheckpointStore(directory, "m")
    checkpoint = store.load_latest()
    assert checkpoint is not None and "average_choice_averaged" in checkpoint.extra
    checkpoint.extra["average_choice_averaged"] = HOSTILE_CHOICES[name]
    store.write(checkpoint)  # the same version, rewritten with a valid checksum
    assert len(store.paths()) == 1
    restored = trainer(directory, **settings)
    assert restored.restored_from is not None
    assert not restored.step.serve_average
    assert restored.step.average_state()["average_steps"] == t.step.average_state()["average_steps"]
    restored.train_batch(batch(np.ones((4, 3))))
    assert restored.samples_seen == t.samples_seen + 4


@pytest.mark.parametrize(
    "bad",
    [np.array(["1", "2"]), np.array([b"\xff\xfe", b"x"]), np.array([None, 1.0], dtype=object)],
)
def test_a_window_from_anything_but_numbers_is_refused(bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="pairs"):
        WindowedMean.from_batches(10, bad)


def test_the_averaged_weights_score_every_row_where_served_and_a_sample_where_not() -> None:
    """Where the averaged weights are not served, their scores only choose which weights are:
    a batch larger than ``COMPARISON_ROWS`` is scored on that many rows, evenly spaced, with
    exactly the scores a full pass gives those rows. Served, they score every row; and only
    the rows the caller reads (``scored_rows``: a batch's own samples before the replayed ones)."""
    from livefit.server.train.train_step import COMPARISON_ROWS

    t = trainer(train={"weight_average": 0.9})
    rng = np.random.default_rng(4)
    for _ in range(5):  # the average now differs from the trained weights
        t.train_batch(batch(rng.normal(size=(16, 3)), backlog=1))
    step = t.step

    def averaged_predictions(x: np.ndarray) -> np.ndarray:
        step.serve_average = True
        other = trainer(train={"weight_average": 0.9})
        other.model.set_weights(step.served_weights())
        return np.asarray(other.model(x))

    n = 4 * COMPARISON_ROWS + 3
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y, w = x.sum(axis=1, keepdims=True), np.ones(n, np.float32)
    want = averaged_predictions(x)
    step.serve_average = False
    sampled = step(x, y, w)
    rows = np.arange(0, n, 5)  # stride ceil(n / COMPARISON_ROWS) = 5: at most that many rows
    assert sampled.average_rows is not None and len(rows) <= COMPARISON_ROWS
    np.testing.assert_array_equal(sampled.average_rows, rows)
    assert sampled.average_predictions is not None and sampled.average_losses is not None
    np.testing.assert_allclose(sampled.average_predictions, want[rows], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        sampled.average_losses, ((want[rows] - y[rows]) ** 2)[:, 0], rtol=1e-4, atol=1e-6
    )
    assert len(sampled.prequential_losses) == n  # the trained weights' scores: every row

    want = averaged_predictions(x)  # served: every row
    served = step(x, y, w)
    assert served.average_rows is None and served.average_predictions is not None
    np.testing.assert_allclose(served.average_predictions, want, rtol=1e-5, atol=1e-6)
    # only the rows read: the first 10 (served), then none (a batch's later steps)
    first = step(x, y, w, scored_rows=10)
    np.testing.assert_array_equal(first.average_rows, np.arange(10))  # type: ignore[arg-type]
    assert first.average_losses is not None and len(first.average_losses) == 10
    later = step(x, y, w, scored_rows=0)
    assert later.average_losses is not None and len(later.average_losses) == 0


def test_the_choice_compares_the_same_rows_whichever_weights_are_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The windowed comparison takes the rows the averaged weights score when they are not
    served (here 2 of 4: rows 0 and 2), also when they are served and scored every row: what
    the windows hold does not depend on which weights were served."""
    from livefit.server.train import train_step

    monkeypatch.setattr(train_step, "COMPARISON_ROWS", 2)
    trained = np.array([1.0, 0.0, 1.0, 0.0])
    # There the trained weights did worse (1.0 against 0.8), though their mean over all four
    # rows (0.5) is the lower.
    sampled = StepResult(
        0.0, trained, np.zeros((4, 1)), True, np.full(2, 0.8), np.ones((2, 1)), np.array([0, 2])
    )
    full = StepResult(0.0, trained, np.zeros((4, 1)), True, np.array([0.8, 9.0, 0.8, 9.0]),
                      np.ones((4, 1)))  # fmt: skip
    windows = []
    for serve_average, result in ((False, sampled), (True, full)):
        t = trainer(train={"weight_average": 0.9})
        t.step.serve_average = serve_average
        served = t.policy.choice.choose(result)
        assert t.step.serve_average  # the averaged weights did better on rows 0 and 2
        want = result.average_losses if serve_average else trained
        np.testing.assert_array_equal(served.prequential_losses, want)
        windows.append(
            [t.policy.choice.trained_loss.batches(), t.policy.choice.average_loss.batches()]
        )
    for a, b in zip(*windows, strict=True):
        np.testing.assert_array_equal(a, b)
    # served averaged weights scored on a sample would misreport what clients got
    t = trainer(train={"weight_average": 0.9})
    t.step.serve_average = True
    with pytest.raises(RuntimeError, match="sample"):
        t.policy.choice.choose(sampled)


@pytest.mark.parametrize("serve_average", [False, True])
def test_a_batch_from_a_backlog_keeps_the_choice(serve_average: bool) -> None:
    """Most batches taken from a backlog skip the comparison, as they skip the extra steps and
    the replay: the windowed losses that choose stay as they were and the served weights with
    them, whichever did better on them. The averaged weights score every row where they are
    served (their scores are the prequential ones), none where they are not. The next
    caught-up batch compares again, and so does every ``BACKLOG_COMPARISON_EVERY``-th batch
    of a backlog."""
    from livefit.server.train.weight_choice import BACKLOG_COMPARISON_EVERY

    t = trainer(train={"weight_average": 0.9})
    policy, step = t.policy, t.step
    rng = np.random.default_rng(6)
    for _ in range(3):  # caught up: both windows hold these batches
        t.train_batch(batch(rng.normal(size=(16, 3))))
    step.serve_average = serve_average
    windows = [policy.choice.trained_loss.batches(), policy.choice.average_loss.batches()]
    # whichever weights did better on the backlog's batches, nothing switches
    policy.choice.average_did_better = lambda: not serve_average  # type: ignore[method-assign]
    for _ in range(BACKLOG_COMPARISON_EVERY - 1):
        x = rng.normal(size=(16, 3))
        learned = policy.learn(batch(x, backlog=5))
        assert step.serve_average == serve_average
        first = learned.first
        if serve_average:  # every row, reported as the prequential scores
            assert first.average_rows is None and first.average_losses is not None
            np.testing.assert_array_equal(first.prequential_losses, first.average_losses)
        else:
            assert first.average_losses is not None and len(first.average_losses) == 0
            assert len(first.prequential_losses) == 16
    for before, after in zip(
        windows,
        [policy.choice.trained_loss.batches(), policy.choice.average_loss.batches()],
        strict=True,
    ):
        np.testing.assert_array_equal(before, after)
    policy.learn(batch(rng.normal(size=(16, 3))))  # caught up: compared, and switched
    assert len(policy.choice.trained_loss.batches()) == len(windows[0]) + 1
    assert step.serve_average != serve_average
    # from a backlog, one batch in BACKLOG_COMPARISON_EVERY compares (and switches back)
    policy.choice.average_did_better = lambda: serve_average  # type: ignore[method-assign]
    for i in range(BACKLOG_COMPARISON_EVERY):
        policy.learn(batch(rng.normal(size=(16, 3)), backlog=5))
        assert step.serve_average == (serve_average if i == BACKLOG_COMPARISON_EVERY - 1
                                      else not serve_average)  # fmt: skip
    assert len(policy.choice.trained_loss.batches()) == len(windows[0]) + 2
