"""The guard (``Guard``): serving holds the last good version of a model while the newest scores
worse, and follows the trainer again once it recovers. Training goes on throughout.

Two ways to score, never mixed: scores taken on different samples are never compared.
- **A trusted reference set** (``ReferenceSet``, a CSV the operator vouches for, never trained
  on; ``ReferenceFile`` reads it again when the operator replaces it): each snapshot handed to
  serving is scored on it (the newest always; older ones while the guard keeps up). The newest
  worse than the best of the recent versions by more than the margin: serving holds that best
  version.
- **Shadow**: without a reference set, each batch the trainer learns (``batch_scored``) is
  predicted, before nothing else, by the newest kept version that had not learned it and by a
  candidate (the last good version), both served snapshots on the guard's runtime. The newest's
  mean loss over a window of such samples worse than the candidate's by the margin, and by more
  than chance explains (a paired t statistic on the per-sample differences, winsorized so that a
  broken message's few samples, far off for both, do not decide; at the noise floor a 10 % gap
  is chance): serving holds the candidate, only while that lasts. A window that finds the newest
  no worse makes it the candidate (unless its own last batch alone was worse: a step ruined just
  before the window closed is not trusted). A drift hurts both alike on the same samples, and
  the newest adapts first, so it never holds through one; a label-flipping publisher is caught
  only with a reference set: the newest agrees with the flipped labels better than the good
  version does.

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
WINDOW_T = 3.0  # shadow: a window holds only when the newest is worse by this paired t
LAST_BATCH_T = 1.0  # the last batch (a few samples) is not trusted on weaker evidence
WINSOR_SHARE = 0.05  # each tail of the differences clipped before the t statistic


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


class ReferenceFile:
    """The reference CSV at ``path``, read again when the operator replaces it (its size or
    modification time changes): a drift makes a reference set stale, and refreshing the file
    needs no restart. A new file that cannot be read is logged and the set before it kept."""

    def __init__(
        self, path: str | Path, input_shape: Sequence[int], output_shape: Sequence[int]
    ) -> None:
        self.path = Path(path)
        self.input_shape, self.output_shape = tuple(input_shape), tuple(output_shape)
        self._stamp = self._stat()
        self.current = ReferenceSet.load(self.path, input_shape, output_shape)  # refuses a start

    def _stat(self) -> tuple[int, int] | None:
        try:
            found = self.path.stat()
        except OSError:
            return None
        return found.st_mtime_ns, found.st_size

    def reloaded(self) -> ReferenceSet | None:
        """The set read again when the file changed since it was last read, else None."""
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            fresh = ReferenceSet.load(self.path, self.input_shape, self.output_shape)
        except ReferenceSetError as exc:
            log.warning("the guard keeps its reference set: the changed file cannot be used "
                        "(%s)", exc)  # fmt: skip
            return None
        self.current = fresh
        return fresh


@dataclass(frozen=True, slots=True)
class ScoredBatch:
    """A batch the trainer learned (shadow side): the samples, their weights and the version
    that predicted them before they were learned."""

    x: np.ndarray
    y: np.ndarray
    w: np.ndarray  # (n,) sample weights: one of 0 is not learned, so not compared
    version: int  # the trainer's version before learning them


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
        reference: ReferenceSet | ReferenceFile | None = None,
        clock: Callable[[], float] = time.time,
        samples_seen: Callable[[], int] = lambda: 0,
    ) -> None:
        self.name = name
        self.settings = settings
        self.book = book
        self.predict = predict
        self.losses = losses
        self.metrics = metrics.group(GuardMetrics)
        self.metrics.init_model(name)
        self.event = event
        self.reference_file = reference if isinstance(reference, ReferenceFile) else None
        self.reference = reference.current if isinstance(reference, ReferenceFile) else reference
        self.clock = clock
        self.samples_seen = samples_seen  # the trainer's count: how much a hold kept back
        self.scores: OrderedDict[int, float] = OrderedDict()  # reference: version -> loss
        self.candidate: Snapshot | None = None  # shadow: the last good version
        self._window = _Window()  # shadow: this window's paired losses
        self.held: int | None = None
        self.held_since: float | None = None
        self._held_counted = 0  # samples_seen when the held samples were last counted
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
        self._count_held()
        self._check_long()

    # the reference set ---------------------------------------------------------------------------
    def _score_reference(self, snapshot: Snapshot) -> None:
        fresh = self.reference_file.reloaded() if self.reference_file is not None else None
        if fresh is not None:
            self._take_reference(fresh)
        loss = self._reference_loss(snapshot)
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

    def _reference_loss(self, snapshot: Snapshot) -> float:
        ref = self.reference
        assert ref is not None
        loss = float(np.mean(self.losses(self.predict(snapshot, ref.x), ref.y)))
        return loss if math.isfinite(loss) else math.inf

    def _take_reference(self, fresh: ReferenceSet) -> None:
        """Score from now on ``fresh``: the scores taken on the old set are dropped (never
        compared with new ones); a version held is scored again on the new set first."""
        self.reference = fresh
        self.scores.clear()
        held = self.book.versions.get(self.held) if self.held is not None else None
        if held is not None:
            self.scores[held.version] = self._reference_loss(held)
        log.info("%s: the guard reads its reference set again: %d samples", self.name,
                 len(fresh.x))  # fmt: skip
        self._publish("reference_reloaded", None, None, None)

    # the shadow comparison -----------------------------------------------------------------------
    def _score_shadow(self, batch: ScoredBatch) -> None:
        newest = self.book.versions.at_or_before(batch.version)
        if newest is None:
            return  # nothing served yet
        candidate = self.candidate
        if candidate is None or candidate.lineage != newest.lineage:
            self.candidate, self._window = newest, _Window()  # a start, or a new lineage
            return
        if newest.version == candidate.version:
            return  # the candidate scored itself: nothing to compare
        counted = np.asarray(batch.w) > 0  # a sample of weight 0 is not learned either
        if not counted.any():
            return
        x, y = batch.x[counted], batch.y[counted]
        ours = _finite(self.losses(self.predict(newest, x), y))
        theirs = _finite(self.losses(self.predict(candidate, x), y))
        window = self._window
        window.add(ours, theirs, newest)
        if window.samples < self.settings.window:
            return
        self._window = _Window()
        ours, theirs = np.concatenate(window.newest), np.concatenate(window.candidate)
        newest_loss, candidate_loss = _mean(ours), _mean(theirs)
        self.metrics.newest_loss.labels(model=self.name).set(newest_loss)
        if self._worse_on_the_same(ours, theirs, WINDOW_T):
            self._hold(candidate.version, newest_loss, candidate_loss, newest.version)
            return
        if self.held is not None:
            self._release(newest_loss, candidate_loss, newest.version)
        last = window.newest[-1], window.candidate[-1]
        if not self._worse_on_the_same(*last, LAST_BATCH_T):  # ruined just before the end
            self.candidate = window.last_version or candidate

    def _worse_on_the_same(self, ours: np.ndarray, theirs: np.ndarray, t: float) -> bool:
        """Whether the newest's per-sample losses ``ours`` are worse than the candidate's
        ``theirs`` on the same samples: the mean by more than the margin, and by more than
        chance explains (a paired t statistic over ``t``, on the differences winsorized at
        their 5 % tails, so that the few samples of a broken message, far off for both, do not
        decide). At the noise floor a 10 % gap between means is chance."""
        if not self._worse(_mean(ours), _mean(theirs)):
            return False
        return paired_t(ours - theirs) > t

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
            if self.candidate is not None and self.candidate.version == version:
                self.candidate = None  # the shadow starts over from the newest
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

    def _count_held(self) -> None:
        """Count the samples learned while a hold kept them from serving."""
        seen = self.samples_seen()
        if self.held is not None and seen > self._held_counted:
            self.metrics.held_samples.labels(model=self.name).inc(seen - self._held_counted)
        self._held_counted = seen

    def _check_long(self) -> None:
        """Say once per hold when it has lasted ``held_long_s``: the reference may be stale."""
        if self.held_since is None or self._long_reported:
            return
        if self.clock() - self.held_since < self.settings.held_long_s:
            return
        self._long_reported = True
        log.warning(
            "%s: the guard has held v%s for over %g s; if the stream drifted for real, refresh "
            "the reference set (guard.reference_path: replace the file, it is read again)",
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


class _Window:
    """The shadow side's paired per-sample losses over one window: the newest's and the
    candidate's on the same samples, batch by batch."""

    def __init__(self) -> None:
        self.newest: list[np.ndarray] = []
        self.candidate: list[np.ndarray] = []
        self.samples = 0
        self.last_version: Snapshot | None = None  # the newest that scored the last batch

    def add(self, newest: np.ndarray, candidate: np.ndarray, version: Snapshot) -> None:
        self.newest.append(newest)
        self.candidate.append(candidate)
        self.samples += len(newest)
        self.last_version = version


def _finite(losses: np.ndarray) -> np.ndarray:
    """Per-sample ``losses`` as float64, a non-finite one infinite (the worst)."""
    found = np.asarray(losses, dtype=np.float64).reshape(-1)
    return np.where(np.isfinite(found), found, np.inf)


def _mean(losses: np.ndarray) -> float:
    return float(np.mean(losses)) if len(losses) else 0.0


def paired_t(differences: np.ndarray) -> float:
    """The t statistic of the mean of ``differences`` (per-sample loss differences on the same
    samples), winsorized at ``WINSOR_SHARE`` in each tail; 0 for fewer than 2 samples, +inf
    for a constant positive difference, and +inf where one is (an infinite newest loss)."""
    d = np.asarray(differences, dtype=np.float64)
    if len(d) < 2:
        return 0.0
    if np.isposinf(d).any() and not np.isneginf(d).any():
        return math.inf
    d = d[np.isfinite(d)]
    if len(d) < 2:
        return 0.0
    low, high = np.quantile(d, [WINSOR_SHARE, 1 - WINSOR_SHARE])
    d = np.clip(d, low, high)
    spread = float(np.std(d, ddof=1))
    mean = float(np.mean(d))
    if spread == 0.0:
        return math.inf if mean > 0 else 0.0
    return mean / (spread / math.sqrt(len(d)))
