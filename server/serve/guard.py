"""The guard (``Guard``): serving holds the last good version of a model while the newest scores
worse, and follows the trainer again once it recovers. Training goes on throughout.

Two ways to score, never mixed: scores taken on different samples are never compared.
- **A trusted reference set** (``ReferenceSet``, a CSV the operator vouches for, never trained
  on): each snapshot handed to serving is scored on it (the newest always; older ones while the
  guard keeps up). The newest worse than the best of the recent versions by more than the
  margin: serving holds that best version.
- **Shadow**: without a reference set, a candidate (the newest version when a window of samples
  last found the newest no worse) predicts the very samples the trainer scored the newest on
  before learning them (``batch_scored``). The newest's windowed mean loss on those samples worse
  than the candidate's by the margin: serving holds the candidate, only while that lasts.

A hold is a move of the serving record (``VersionBook``: actions ``guard_hold`` and
``guard_release``), so it is durable and replicas follow; an operator's pin wins over it. The
scoring runs on the guard's own thread (newest wins), off the trainer's and the requests' paths.
"""

from __future__ import annotations

import csv
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..base.latest_worker import LatestWorker
from ..base.metrics import Metrics
from ..config.model_tables import GuardSettings
from ..wire.snapshot import Snapshot
from .metrics import GuardMetrics
from .version_book import Move, MoveRefused, VersionBook

log = logging.getLogger(__name__)
Predict = Callable[[Snapshot, np.ndarray], np.ndarray]  # a version's outputs for rows x
Losses = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (predictions, y) -> per-sample loss
Event = Callable[[dict[str, Any]], None]
TINY_LOSS = 1e-12  # a best loss of 0 still leaves room for a margin


EPSILON = 1e-7  # Keras' clip of probabilities in its crossentropies


class Loadable(Protocol):
    """A runtime of the guard's own (``serve.runtimes``): weights loaded, then rows run."""

    def load(self, weights: Sequence[np.ndarray]) -> None: ...

    def __call__(self, rows: np.ndarray) -> np.ndarray: ...


def snapshot_predict(runtime: Loadable) -> Predict:
    """``Predict`` over ``runtime``, loading each snapshot's weights when it changes (called on
    the guard's thread only: the runtime is the guard's, never serving's)."""
    loaded: list[tuple[str, int]] = []

    def predict(snapshot: Snapshot, x: np.ndarray) -> np.ndarray:
        key = (snapshot.lineage, snapshot.version)
        if loaded != [key]:
            runtime.load(snapshot.weights)
            loaded[:] = [key]
        return np.asarray(runtime(x), dtype=np.float32)

    return predict


def _mse(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.mean(np.square(p - y).reshape(len(p), -1), axis=-1)


def _mae(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.mean(np.abs(p - y).reshape(len(p), -1), axis=-1)


def _binary(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    p = np.clip(p, EPSILON, 1 - EPSILON)
    bce = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    return np.mean(bce.reshape(len(p), -1), axis=-1)


def _categorical(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    p = np.clip(p / np.sum(p, axis=-1, keepdims=True), EPSILON, 1 - EPSILON)
    return -np.sum(y * np.log(p), axis=-1).reshape(len(p), -1).mean(axis=-1)


def _sparse(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    p = np.clip(p / np.sum(p, axis=-1, keepdims=True), EPSILON, 1 - EPSILON)
    classes = y.astype(np.int64).reshape(len(p), -1)[:, 0]
    return -np.log(p.reshape(len(p), -1)[np.arange(len(p)), classes])


LOSSES: dict[str, Losses] = {
    "mse": _mse, "mean_squared_error": _mse, "MSE": _mse, "MeanSquaredError": _mse,
    "mae": _mae, "mean_absolute_error": _mae, "MAE": _mae, "MeanAbsoluteError": _mae,
    "binary_crossentropy": _binary, "BinaryCrossentropy": _binary,
    "categorical_crossentropy": _categorical, "CategoricalCrossentropy": _categorical,
    "sparse_categorical_crossentropy": _sparse, "SparseCategoricalCrossentropy": _sparse,
}  # fmt: skip


def numpy_losses(loss: str) -> Losses:
    """The per-sample loss ``loss`` (a model's Keras loss name) in NumPy, on probabilities as
    the model outputs them; a ValueError naming the ones the guard knows for any other."""
    try:
        return LOSSES[loss]
    except KeyError:
        known = "mse, mae, binary_crossentropy, categorical_crossentropy, "
        raise ValueError(
            f"the guard cannot score loss {loss!r}: it knows {known}"
            "sparse_categorical_crossentropy (set guard.enabled = false for this model)"
        ) from None


class ReferenceSetError(ValueError):
    """A reference set that cannot be read: the message names the file and the row."""


@dataclass(frozen=True, slots=True)
class ReferenceSet:
    """Labelled samples the operator vouches for: ``x`` (n, *input_shape), ``y`` (n, *output)."""

    x: np.ndarray
    y: np.ndarray

    @classmethod
    def load(
        cls, path: str | Path, input_shape: Sequence[int], output_shape: Sequence[int]
    ) -> ReferenceSet:
        """The CSV at ``path``: per row the inputs flattened, then the target flattened."""
        n_in, n_out = math.prod(input_shape), math.prod(output_shape)
        rows: list[list[float]] = []
        try:
            with open(path, newline="") as handle:
                for number, row in enumerate(csv.reader(handle), 1):
                    if not row or row[0].lstrip().startswith("#"):
                        continue
                    if len(row) != n_in + n_out:
                        raise ReferenceSetError(f"{path} row {number}: {len(row)} values, expected "
                                             f"{n_in} inputs and {n_out} targets")  # fmt: skip
                    rows.append([float(v) for v in row])
        except OSError as exc:
            raise ReferenceSetError(f"reference set {path} cannot be read: {exc}") from None
        except ValueError as exc:
            if isinstance(exc, ReferenceSetError):
                raise
            raise ReferenceSetError(f"reference set {path}: {exc}") from None
        if not rows:
            raise ReferenceSetError(f"reference set {path} holds no samples")
        data = np.asarray(rows, dtype=np.float32)
        x = data[:, :n_in].reshape(-1, *input_shape)
        return cls(x, data[:, n_in:].reshape(-1, *output_shape))


@dataclass(frozen=True, slots=True)
class ScoredBatch:
    """Samples the trainer scored the newest version on before learning them (shadow side)."""

    x: np.ndarray
    y: np.ndarray
    losses: np.ndarray  # (n,) the newest's per-sample loss
    version: int  # the version that scored them


class Guard:
    """Model ``name``'s guard (module docstring). ``predict`` runs a version (a runtime of its
    own, not serving's); ``losses`` is the model's loss per sample; ``event`` publishes one on
    the events topic."""

    def __init__(
        self,
        name: str,
        settings: GuardSettings,
        book: VersionBook,
        predict: Predict,
        losses: Losses,
        metrics: Metrics,
        event: Event,
        reference: ReferenceSet | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.settings = settings
        self.book = book
        self.predict = predict
        self.losses = losses
        self.metrics = metrics.group(GuardMetrics)
        self.metrics.init_model(name)
        self.event = event
        self.reference = reference
        self.clock = clock
        self.scores: OrderedDict[int, float] = OrderedDict()  # reference: version -> loss
        self.candidate: Snapshot | None = None  # shadow: the last good version
        self._newest_sum = self._candidate_sum = 0.0
        self._paired = 0  # shadow: samples scored by both in this window
        self.held: int | None = None
        self.held_since: float | None = None
        self._long_reported = False
        self._worker: LatestWorker[Snapshot | ScoredBatch] = LatestWorker(
            f"guard-{name}", self.handle
        )

    def start(self) -> None:
        self._worker.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._worker.stop(timeout)

    def snapshot_arrived(self, snapshot: Snapshot) -> None:
        """A snapshot was handed to serving (a slot's listener; returns at once)."""
        if self.reference is not None:
            self._worker.offer(snapshot)

    def batch_scored(self, batch: ScoredBatch) -> None:
        """The trainer scored ``batch`` before learning it (returns at once; shadow side)."""
        if self.reference is None:
            self._worker.offer(batch)

    def handle(self, item: Snapshot | ScoredBatch) -> None:
        """Score ``item`` and decide (the guard's thread; a test calls it directly)."""
        if isinstance(item, Snapshot):
            self._score_reference(item)
        else:
            self._score_shadow(item)
        self._check_long()

    # the reference set ---------------------------------------------------------------------------
    def _score_reference(self, snapshot: Snapshot) -> None:
        assert self.reference is not None
        ref = self.reference
        loss = float(np.mean(self.losses(self.predict(snapshot, ref.x), ref.y)))
        if not math.isfinite(loss):
            loss = math.inf
        self.scores[snapshot.version] = loss
        for version in list(self.scores)[
            : max(0, len(self.scores) - self.settings.recent_versions)
        ]:
            if version != self.held:  # the held score stays: the poisoned ones must not outlast it
                del self.scores[version]
        self.metrics.newest_loss.labels(model=self.name).set(loss)
        best_version, best = min(self.scores.items(), key=lambda item: (item[1], -item[0]))
        if self._worse(loss, best):
            self._hold(best_version, loss, best, snapshot.version)
        elif self.held is not None:
            self._release(loss, self.scores.get(self.held, best), snapshot.version)

    # the shadow comparison -----------------------------------------------------------------------
    def _score_shadow(self, batch: ScoredBatch) -> None:
        if self.candidate is None:
            self.candidate = self._kept(batch.version)
            return
        if batch.version == self.candidate.version:
            return  # the candidate scored itself: nothing to compare
        theirs = self.losses(self.predict(self.candidate, batch.x), batch.y)
        self._newest_sum += float(np.sum(batch.losses))
        self._candidate_sum += float(np.sum(theirs))
        self._paired += len(batch.losses)
        if self._paired < self.settings.window:
            return
        newest = self._newest_sum / self._paired
        candidate = self._candidate_sum / self._paired
        self._newest_sum = self._candidate_sum = 0.0
        self._paired = 0
        self.metrics.newest_loss.labels(model=self.name).set(newest)
        if self._worse(newest, candidate):
            self._hold(self.candidate.version, newest, candidate, batch.version)
            return
        if self.held is not None:
            self._release(newest, candidate, batch.version)
        self.candidate = self._kept(batch.version) or self.candidate  # the newest is good

    def _kept(self, version: int) -> Snapshot | None:
        return self.book.versions.get(version)

    # deciding ------------------------------------------------------------------------------------
    def _worse(self, newest: float, best: float) -> bool:
        if math.isinf(newest) and math.isfinite(best):
            return True
        return newest > best + self.settings.margin * max(abs(best), TINY_LOSS)

    def _hold(self, version: int, newest: float, best: float, newest_version: int) -> None:
        self.metrics.best_loss.labels(model=self.name).set(best)
        if self.held == version:
            return
        try:
            self.book.move(Move("guard_hold", version=version))
        except MoveRefused as exc:  # the best version expired meanwhile: try the next score
            log.warning("%s: the guard could not hold v%d: %s", self.name, version, exc.message)
            self.scores.pop(version, None)
            return
        if self.held is None:
            self.held_since = self.clock()
            self._long_reported = False
        self.held = version
        self.metrics.holds.labels(model=self.name).inc()
        self.metrics.held_version.labels(model=self.name).set(version)
        log.warning(
            "%s: the guard holds v%d (loss %.6g) in serving: the newest v%d scores %.6g on %s, "
            "worse by more than %g; training goes on (livefit_guard_held_version)",
            self.name, version, best, newest_version, newest, self._basis(), self.settings.margin,
        )  # fmt: skip
        self._publish("hold", newest_version, newest, best)

    def _release(self, newest: float, held_loss: float, newest_version: int) -> None:
        held = self.held
        try:
            self.book.move(Move("guard_release"))
        except MoveRefused as exc:
            log.warning("%s: the guard could not release v%s: %s", self.name, held, exc.message)
            return
        log.info("%s: the guard releases v%s: the newest v%d scores %.6g on %s (held %.6g)",
                 self.name, held, newest_version, newest, self._basis(), held_loss)  # fmt: skip
        self._publish("release", newest_version, newest, held_loss)
        self.held = self.held_since = None
        self.metrics.held_version.labels(model=self.name).set(-1)

    def _check_long(self) -> None:
        """Say once per hold when it has lasted ``held_long_s``: the reference may be stale."""
        if self.held_since is None or self._long_reported:
            return
        if self.clock() - self.held_since < self.settings.held_long_s:
            return
        self._long_reported = True
        log.warning(
            "%s: the guard has held v%s for over %g s; if the stream drifted for real, refresh "
            "the reference set (guard.reference_path)",
            self.name, self.held, self.settings.held_long_s,
        )  # fmt: skip
        self._publish("held_long", None, None, None)

    def _basis(self) -> str:
        return "the reference set" if self.reference is not None else "the same samples"

    def _publish(
        self, action: str, newest_version: int | None, newest: float | None, held: float | None
    ) -> None:
        since = self.held_since
        self.event({
            "event": "guard", "model": self.name, "action": action, "basis": self._basis(),
            "held_version": self.held, "newest_version": newest_version, "newest_loss": newest,
            "held_loss": held, "margin": self.settings.margin, "held_since": since,
            "held_long": since is not None and self.clock() - since >= self.settings.held_long_s,
            "time": self.clock(),
        })  # fmt: skip
