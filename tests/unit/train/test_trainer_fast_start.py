"""A fresh model's fast start (``train.fast_start_samples``): its first batches are no larger
than what it has learned so far (at least ``FAST_START_MIN_BATCH``), each scored before it is
learned, through the trainer's own ``next_batch`` (what its thread takes, pipelined or not)."""

from __future__ import annotations

from typing import Any

import numpy as np

from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.ingest.sample_queue import SampleQueue
from livefit.server.train.trainer import FAST_START_MIN_BATCH, Trainer
from livefit.server.wire.samples import SampleChunk
from livefit.server.wire.snapshot import SnapshotSlot
from tests.step_pool import pooled_steps

RNG = np.random.default_rng(11)


def _trainer(**train: Any) -> Trainer:
    settings = ModelSettings.model_validate(
        {"input_shape": [3], "output_shape": [1], "seed": 1, "train": train}
    )
    with pooled_steps():
        trainer = Trainer("m", settings, SampleQueue(10_000), SnapshotSlot(), Metrics(), "/CPU:0")
    trainer.warm_up()
    return trainer


def _put(trainer: Trainer, rows: int) -> None:
    x = RNG.normal(size=(rows, 3)).astype(np.float32)
    y = (x.sum(axis=1, keepdims=True) + 40.0).astype(np.float32)
    trainer.queue.put(SampleChunk(x, y, np.ones(rows, np.float32), None, None))


def _drain(trainer: Trainer) -> list[tuple[int, int]]:
    """(size, backlog) of every batch the trainer takes until the queue is empty, each learned."""
    taken = []
    while len(trainer.queue):
        batch = trainer.next_batch()
        assert batch is not None
        taken.append((len(batch), batch.backlog))
        trainer.train_batch(batch)
    return taken


def test_a_fresh_model_learns_its_first_message_in_batches_that_grow() -> None:
    trainer = _trainer()
    assert trainer.fast_start_samples == 100 and FAST_START_MIN_BATCH == 5  # mse's default
    _put(trainer, 25)
    assert _drain(trainer) == [(5, 0), (5, 0), (10, 0), (5, 0)]  # each one caught up
    assert trainer.samples_seen == 25
    _put(trainer, 25)
    assert _drain(trainer) == [(25, 0)]  # 25 learned: as large as what it learned
    _put(trainer, 300)
    assert [size for size, _ in _drain(trainer)] == [50, 250]  # 100 learned: no limit left
    assert trainer.samples_seen == 350


def test_each_fast_start_batch_is_scored_before_it_is_learned() -> None:
    """The first message's later batches are predicted by the weights that learned the ones
    before: targets near 40 are no longer all predicted by the untrained weights (about 0)."""
    cumulative_mae = []
    for fast_start in (100, 0):
        trainer = _trainer(fast_start_samples=fast_start)
        _put(trainer, 25)
        _drain(trainer)
        cumulative_mae.append(trainer.scores.scores["mae"].cumulative)
    with_start, without = cumulative_mae
    assert without > 35  # 25 predictions of about 0 for targets about 40
    assert with_start < 0.5 * without  # only the first 5 were the untrained weights'


def test_with_fast_start_off_the_first_message_is_one_batch() -> None:
    trainer = _trainer(fast_start_samples=0)
    _put(trainer, 25)
    assert _drain(trainer) == [(25, 0)]


def test_a_backlog_at_the_start_is_still_taken_as_a_backlog() -> None:
    """A batch cut short by the fast start reports what a full batch would have left: with
    600 queued and batches of 256, every batch until the queue holds one full batch is from a
    backlog (no extra steps or replay: ``train.extras_when``)."""
    trainer = _trainer(max_batch_size=256)
    _put(trainer, 600)
    taken = _drain(trainer)
    assert [size for size, _ in taken] == [5, 5, 10, 20, 40, 80, 256, 184]
    assert [backlog for _, backlog in taken] == [344, 339, 334, 324, 304, 264, 184, 0]


def test_a_model_that_has_learned_enough_takes_full_batches() -> None:
    """The count of samples learned decides (a restored model's is its checkpoint's)."""
    trainer = _trainer()
    trainer.progress.samples_seen = 100
    _put(trainer, 60)
    assert _drain(trainer) == [(60, 0)]


def test_the_trainers_thread_takes_the_same_batches() -> None:
    """Through ``start`` and ``stop`` (the server's loop), pipelined and not: the versions are
    the fast start's four batches' steps (four a batch for regression, each caught up)."""
    versions = {}
    for pipeline in ("off", "on"):
        trainer = _trainer(pipeline=pipeline, max_batch_size=32)
        _put(trainer, 25)
        trainer.start()
        trainer.stop(timeout=60)
        versions[pipeline] = (trainer.version, trainer.samples_seen)
    assert versions == {"off": (16, 25), "on": (16, 25)}


def test_a_backlog_at_the_start_through_the_trainers_thread() -> None:
    """The server's loops take the same batches as ``next_batch`` one after the other,
    pipelined too: a batch of the fast start waits for the step before it (its size is what
    that step makes the count), then full batches overlap as before."""
    sizes = {}
    for pipeline in ("off", "on"):
        trainer = _trainer(pipeline=pipeline, max_batch_size=256)
        taken: list[int] = []
        take = trainer.next_batch

        def recording(*args: Any, _take: Any = take, _taken: list[int] = taken, **kw: Any) -> Any:
            batch = _take(*args, **kw)
            if batch is not None:
                _taken.append(len(batch))
            return batch

        trainer.next_batch = recording  # type: ignore[method-assign]
        _put(trainer, 600)
        trainer.start()
        trainer.stop(timeout=60)
        assert trainer.samples_seen == 600
        sizes[pipeline] = taken
    assert sizes["off"] == sizes["on"] == [5, 5, 10, 20, 40, 80, 256, 184]


def test_the_fast_start_is_on_by_default_for_regression_losses_only() -> None:
    """Unset, ``train.fast_start_samples`` is 100 for regression losses and 0 for the others
    (measured: it lowered the MAE after the first message on the five regression streams
    and the accuracy on eight of ten classification streams); a set value is kept."""

    def resolved(loss: str, **train: Any) -> int:
        table = {"input_shape": [3], "output_shape": [2], "loss": loss, "train": train}
        return ModelSettings.model_validate(table).resolved_fast_start_samples()

    assert [resolved(loss) for loss in ("mse", "mae", "huber", "log_cosh")] == [100] * 4
    for loss in ("binary_crossentropy", "sparse_categorical_crossentropy"):
        assert resolved(loss) == 0
        assert resolved(loss, fast_start_samples=100) == 100
    assert resolved("mse", fast_start_samples=0) == 0

    settings = ModelSettings.model_validate(
        {"input_shape": [3], "output_shape": [1], "loss": "binary_crossentropy", "seed": 1}
    )
    trainer = Trainer("c", settings, SampleQueue(1000), SnapshotSlot(), Metrics(), "/CPU:0")
    x = RNG.normal(size=(25, 3)).astype(np.float32)
    y = (x[:, :1] > 0).astype(np.float32)
    trainer.queue.put(SampleChunk(x, y, np.ones(25, np.float32), None, None))
    assert _drain(trainer) == [(25, 0)]  # a classifier's first message is one batch
