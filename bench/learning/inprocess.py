"""livefit in this process: the server's ``Trainer`` fed a stream's chunks without MQTT."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from bench.learning.knobs import Knobs
from bench.learning.scores import Score
from bench.learning.streams import CHUNK, REGRESSION, Stream


def learn_inprocess(stream: Stream, knobs: Knobs | Any, chunk: int = CHUNK) -> Score:
    """Feed ``stream`` to a real ``Trainer`` in chunks of ``chunk``, each one minibatch (a
    fresh model's first chunks: the batches its fast start takes, ``Trainer.next_batch``).

    The same code path as the server from the sample queue on (update policy, train step,
    prequential scores), on this thread: no MQTT, no write-ahead log, no timing effects.
    """
    import keras

    from livefit.server.wire.samples import SampleChunk

    trainer = _trainer(knobs, stream)
    trainer.scores = recorder = _recording_scores(trainer.scores)
    queue = trainer.queue
    started = time.perf_counter()
    with (
        _quiet("livefit.server.train.update_policy"),  # a warning per detected drift
        _quiet("livefit.server.train.accounting"),  # a line per selection switch
    ):
        for start in range(0, len(stream), chunk):
            x, y = stream.x[start : start + chunk], stream.y[start : start + chunk]
            queue.put(SampleChunk(x, y, np.ones(len(x), dtype=np.float32)))
            while len(queue):  # one batch, or a fresh model's first ones (its fast start)
                batch = trainer.next_batch()
                assert batch is not None
                trainer.train_batch(batch)
    seconds = time.perf_counter() - started
    scores = trainer.scores.scores
    detections = trainer.policy.drift.detections if trainer.policy.drift is not None else 0
    extra = {"steps": trainer.version, "drift_detections": detections}
    if trainer.candidates is not None:  # online model selection (bench/learning/selection.py)
        extra["switches"] = trainer.candidates.switches
        extra["served"] = trainer.candidates.served.name
    per_sample = np.concatenate(recorder.per_sample)
    if stream.task == REGRESSION:
        score = Score(
            math.nan, math.nan, trainer.samples_seen, seconds, extra, per_sample,
            mae=scores["mae"].cumulative, rmse=math.sqrt(scores["mse"].cumulative),
        )  # fmt: skip
    else:
        score = Score(
            scores["accuracy"].cumulative, scores["log_loss"].cumulative, trainer.samples_seen,
            seconds, extra, per_sample,
        )  # fmt: skip
    del trainer, queue
    keras.utils.clear_session(free_memory=True)  # its gc.collect() frees the model and graph
    return score


class InProcess:
    """``learn_inprocess``, run once per stream, stream seed and settings (model seed included)."""

    def __init__(self) -> None:
        self._scores: dict[tuple[str, int, str], Score] = {}

    def score(self, stream: Stream, knobs: Knobs) -> Score:
        key = (stream.spec.name, stream.seed, knobs.key())
        if key not in self._scores:
            self._scores[key] = learn_inprocess(stream, knobs)
        return self._scores[key]


def _trainer(knobs: Knobs, stream: Stream) -> Any:
    from prometheus_client import CollectorRegistry

    from livefit.server.base.metrics import Metrics
    from livefit.server.config.model import ModelSettings
    from livefit.server.ingest.sample_queue import SampleQueue
    from livefit.server.train.modeling import resolve_device
    from livefit.server.train.trainer import Trainer
    from livefit.server.wire.snapshot import SnapshotSlot

    config = knobs.model_config(stream.table())
    config.setdefault("train", {})["queue_capacity"] = len(stream) + 1
    settings = ModelSettings.model_validate(config)
    metrics = Metrics(CollectorRegistry())
    metrics.init_model("learning")
    queue = SampleQueue(settings.train.queue_capacity)
    trainer = Trainer("learning", settings, queue, SnapshotSlot(), metrics, resolve_device("auto"))
    trainer.warm_up()
    return trainer


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """Only errors from ``logger_name`` while inside (its level restored after)."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _recording_scores(scores: Any) -> Any:
    """The trainer's prequential scores, also keeping each sample's figure: 1.0 where a
    classifier predicted right, a regressor's absolute error."""
    from livefit.server.train.prequential import PrequentialScores, correct_predictions

    class Recording(PrequentialScores):
        def __init__(self) -> None:
            super().__init__(scores.scores["loss"].window, scores.classification, scores.sparse)
            self.per_sample: list[np.ndarray] = []

        def add(self, losses: np.ndarray, y_true: np.ndarray, y_pred: np.ndarray) -> None:
            super().add(losses, y_true, y_pred)
            if self.classification:
                self.per_sample.append(correct_predictions(y_true, y_pred, self.sparse))
            else:
                error = y_pred.reshape(len(y_pred), -1) - y_true.reshape(len(y_true), -1)
                self.per_sample.append(np.abs(error).mean(axis=1))

    return Recording()
