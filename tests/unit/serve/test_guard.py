"""The guard (``serve.guard``), with a real ``VersionBook`` over kept versions and a linear
model in NumPy: with a reference set it holds the best recent version when the newest falls
behind, never over an operator's pin, and releases on recovery; without one it compares the
newest and a candidate on the same samples only, so a drift the newest follows never holds;
a long hold says so; a reference CSV is checked."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from livefit.server.base.metrics import Metrics
from livefit.server.config.model_tables import GuardSettings, VersionsSettings
from livefit.server.serve.guard import (
    Guard,
    ReferenceFile,
    ReferenceSet,
    ReferenceSetError,
    ScoredBatch,
    numpy_losses,
    paired_t,
    snapshot_predict,
)
from livefit.server.serve.version_book import Move, VersionBook
from livefit.server.serve.versions import KeptVersions
from livefit.server.storage.serving_record_file import ServingRecordFile
from livefit.server.weights.format import WeightsMeta, encode_weights
from livefit.server.wire.snapshot import Snapshot, SnapshotSlot

LINEAGE = "L1"
TRUE_W = np.array([[1.0], [-2.0], [3.0]], np.float32)
RNG = np.random.default_rng(0)


def snapshot(version: int, w: np.ndarray) -> Snapshot:
    return Snapshot("m", version, (w.astype(np.float32),), time.time(), version, lineage=LINEAGE)


def payload(s: Snapshot) -> bytes:
    meta = WeightsMeta("m", s.version, s.samples_seen, s.created_at, None, "fp", s.lineage)
    return encode_weights(["w"], s.weights, meta)


def predict(s: Snapshot, x: np.ndarray) -> np.ndarray:
    return x @ s.weights[0]


def squared(predictions: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.mean((predictions - y) ** 2, axis=-1)


class Fixture:
    """A slot, its kept versions, a real book on ``directory`` and a guard over them."""

    def __init__(
        self,
        directory: Path,
        reference: ReferenceSet | None,
        run: Any = predict,
        losses: Any = squared,
        **settings: Any,
    ) -> None:
        self.slot = SnapshotSlot()
        self.versions = KeptVersions(
            "m", VersionsSettings(keep_snapshots=50), lambda: self.slot.latest
        )
        self.slot.subscribe(self.versions.add)
        self.book = VersionBook(
            "m", self.versions, ServingRecordFile(directory), payload, lambda: LINEAGE,
            lambda record, added, move: None,
        )  # fmt: skip
        self.book.restore()
        self.registry = CollectorRegistry()
        self.events: list[dict[str, Any]] = []
        self.now = 1000.0
        self.guard = Guard(
            "m", GuardSettings(**settings), self.book, run, losses,
            Metrics(self.registry), self.events.append, reference, clock=lambda: self.now,
        )  # fmt: skip

    def publish(self, version: int, w: np.ndarray) -> None:
        s = snapshot(version, w)
        self.slot.publish(s)
        if self.guard.reference is not None:
            self.guard.handle(s)  # what the guard's thread does with the offer

    def served(self) -> int | None:
        return self.book.record().served()

    def metric(self, name: str) -> float | None:
        return self.registry.get_sample_value(name, {"model": "m"})


def reference_set() -> ReferenceSet:
    x = RNG.normal(size=(200, 3)).astype(np.float32)
    return ReferenceSet(x, x @ TRUE_W)


def test_with_a_reference_set_a_poisoned_newest_is_held_back_and_released_on_recovery(
    tmp_path: Path,
) -> None:
    f = Fixture(tmp_path, reference_set(), margin=0.5)
    for version, noise in ((1, 0.11), (2, 0.1), (3, 0.105)):
        f.publish(version, TRUE_W + noise)
    assert f.served() is None and f.events == []
    f.publish(4, -TRUE_W)  # labels flipped: the newest is far worse on the trusted samples
    assert f.served() == 2  # the best recent version
    assert f.metric("livefit_guard_held_version") == 2.0
    assert f.metric("livefit_guard_holds_total") == 1.0
    event = f.events[-1]
    assert event["action"] == "hold" and event["held_version"] == 2 and event["newest_version"] == 4
    assert event["newest_loss"] > event["held_loss"] and event["held_long"] is False
    for version in range(5, 40):  # poisoning goes on past the recent versions kept
        f.publish(version, -TRUE_W)
    assert f.served() == 2 and f.metric("livefit_guard_holds_total") == 1.0
    f.publish(40, TRUE_W + 0.05)  # recovered: better than the held one
    assert f.served() is None and f.events[-1]["action"] == "release"
    assert f.metric("livefit_guard_held_version") == -1.0


def test_an_operator_pin_wins_over_the_guard(tmp_path: Path) -> None:
    f = Fixture(tmp_path, reference_set())
    f.publish(1, TRUE_W)
    f.publish(2, TRUE_W + 0.01)
    f.book.move(Move("pin", version=2))
    f.publish(3, -TRUE_W)
    record = f.book.record()
    assert record.guarded == 1 and record.pinned == 2 and record.served() == 2


def test_a_long_hold_says_so_once(tmp_path: Path) -> None:
    f = Fixture(tmp_path, reference_set(), held_long_s=60.0)
    f.publish(1, TRUE_W)
    f.publish(2, -TRUE_W)
    f.now += 61.0
    f.publish(3, -TRUE_W)
    f.publish(4, -TRUE_W)
    long = [e for e in f.events if e["action"] == "held_long"]
    assert len(long) == 1 and long[0]["held_long"] is True and long[0]["held_version"] == 1


def shadow_batch(
    f: Fixture, version: int, newest_w: np.ndarray, truth: np.ndarray, rows: int = 64
) -> None:
    """Version ``version`` (``newest_w``) is served, then the trainer learns ``rows`` samples."""
    f.publish(version, newest_w)
    x = RNG.normal(size=(rows, 3)).astype(np.float32)
    f.guard.handle(ScoredBatch(x, x @ truth, np.ones(rows, np.float32), version))


def test_without_a_reference_set_a_diverging_newest_is_held_only_while_worse(
    tmp_path: Path,
) -> None:
    f = Fixture(tmp_path, None, window=128, margin=0.2)
    for version in range(1, 6):
        shadow_batch(f, version, TRUE_W + 0.1 / version, TRUE_W)
    assert f.served() is None
    good = f.guard.candidate
    assert good is not None
    for version in range(6, 10):  # a step ruined by an outlier, on the same samples
        shadow_batch(f, version, TRUE_W * 5, TRUE_W)
    assert f.served() == good.version and f.events[-1]["basis"] == "the same samples"
    for version in range(10, 14):
        shadow_batch(f, version, TRUE_W, TRUE_W)
    assert f.served() is None and f.events[-1]["action"] == "release"


def test_without_a_reference_set_a_drift_the_newest_follows_never_holds(tmp_path: Path) -> None:
    f = Fixture(tmp_path, None, window=128, margin=0.1)
    w = TRUE_W.copy()
    for version in range(1, 6):
        shadow_batch(f, version, w, TRUE_W)
    drifted = -TRUE_W  # the concept changes; the newest versions walk towards it
    for version in range(6, 40):
        w = w + 0.2 * (drifted - w)
        shadow_batch(f, version, w, drifted)
    assert f.served() is None and f.events == []


def test_a_reference_csv_is_read_and_a_bad_one_named(tmp_path: Path) -> None:
    good = tmp_path / "ref.csv"
    good.write_text("# x1,x2,y\n1,2,3\n4,5,9\n")
    ref = ReferenceSet.load(good, [2], [1])
    assert ref.x.shape == (2, 2) and ref.y.tolist() == [[3.0], [9.0]]
    bad = tmp_path / "bad.csv"
    bad.write_text("1,2,3\n4,5\n")
    with pytest.raises(ReferenceSetError, match="row 2: 2 values"):
        ReferenceSet.load(bad, [2], [1])
    with pytest.raises(ReferenceSetError, match="cannot be read"):
        ReferenceSet.load(tmp_path / "none.csv", [2], [1])


@pytest.mark.parametrize(
    "name, y, p",
    [
        ("mse", [[1.0, 2.0], [0.0, -1.0]], [[1.5, 1.0], [0.2, -1.0]]),
        ("mae", [[1.0, 2.0], [0.0, -1.0]], [[1.5, 1.0], [0.2, -1.0]]),
        ("binary_crossentropy", [[1.0, 0.0], [0.0, 1.0]], [[0.9, 0.2], [0.4, 1.0]]),
        ("categorical_crossentropy", [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]],
         [[0.2, 0.7, 0.1], [0.0, 0.5, 0.5]]),
        ("sparse_categorical_crossentropy", [[1.0], [0.0]], [[0.2, 0.7, 0.1], [0.0, 0.5, 0.5]]),
    ],
)  # fmt: skip
def test_the_numpy_losses_are_keras_per_sample_losses(name: str, y: Any, p: Any) -> None:
    import keras

    truth, predicted = np.asarray(y, np.float32), np.asarray(p, np.float32)
    expected = np.asarray(keras.losses.get(name)(truth, predicted))
    np.testing.assert_allclose(numpy_losses(name)(predicted, truth), expected, rtol=1e-4)
    with pytest.raises(ValueError, match="cannot score loss 'huber'"):
        numpy_losses("huber")


def test_a_snapshot_is_loaded_into_the_guards_runtime_once_per_version() -> None:
    class Runtime:
        def __init__(self) -> None:
            self.loads: list[np.ndarray] = []

        def load(self, weights: Any) -> None:
            self.loads.append(weights[0])

        def __call__(self, rows: np.ndarray) -> np.ndarray:
            return rows @ self.loads[-1]

    runtime = Runtime()
    run = snapshot_predict(runtime)
    x = RNG.normal(size=(4, 3)).astype(np.float32)
    first, second = snapshot(1, TRUE_W), snapshot(2, -TRUE_W)
    np.testing.assert_allclose(run(first, x), x @ TRUE_W, rtol=1e-6)
    run(first, x)
    np.testing.assert_allclose(run(second, x), -(x @ TRUE_W), rtol=1e-6)
    assert len(runtime.loads) == 2


def test_the_shadow_compares_the_version_that_predicted_the_batch_not_a_later_one(
    tmp_path: Path,
) -> None:
    """The trainer's version moves on before the guard scores: it takes the newest kept at or
    before the batch's version (what served these samples), never one that learned them."""
    f = Fixture(tmp_path, None, window=64, margin=0.2)
    shadow_batch(f, 1, TRUE_W, TRUE_W)  # the first candidate
    f.publish(2, TRUE_W * 5)  # ruined
    f.publish(3, TRUE_W)  # already recovered when the guard looks
    x = RNG.normal(size=(64, 3)).astype(np.float32)
    f.guard.handle(ScoredBatch(x, x @ TRUE_W, np.ones(64, np.float32), 2))
    assert f.served() == 1 and f.events[-1]["newest_version"] == 2


def test_a_version_ruined_in_the_last_batch_of_a_good_window_is_not_the_next_candidate(
    tmp_path: Path,
) -> None:
    f = Fixture(tmp_path, None, window=256, margin=0.2)
    shadow_batch(f, 1, TRUE_W + 0.3, TRUE_W)
    for version in (2, 3, 4):
        shadow_batch(f, version, TRUE_W, TRUE_W, rows=80)
    shadow_batch(f, 5, TRUE_W * 1.3, TRUE_W, rows=16)  # the window closes here, on average fine
    assert f.served() is None and f.guard.candidate is not None
    assert f.guard.candidate.version == 1  # not 5: its own batch was worse
    for version in range(6, 10):
        shadow_batch(f, version, TRUE_W * 1.3, TRUE_W)
    assert f.served() == 1


def test_samples_learned_while_held_are_counted(tmp_path: Path) -> None:
    f = Fixture(tmp_path, None, window=64, margin=0.2)
    seen = [0]
    f.guard.samples_seen = lambda: seen[0]
    shadow_batch(f, 1, TRUE_W, TRUE_W)
    seen[0] = 64
    shadow_batch(f, 2, TRUE_W * 5, TRUE_W)
    assert f.served() == 1
    seen[0] = 128
    shadow_batch(f, 3, TRUE_W * 5, TRUE_W)
    seen[0] = 192
    shadow_batch(f, 4, TRUE_W, TRUE_W)
    assert f.served() is None
    seen[0] = 256
    shadow_batch(f, 5, TRUE_W, TRUE_W)
    assert f.metric("livefit_guard_held_samples_total") == 128.0


def test_an_expired_candidate_starts_the_shadow_over(tmp_path: Path) -> None:
    f = Fixture(tmp_path, None, window=64, margin=0.2)
    f.versions.keep = 2  # the kept snapshots pass the candidate by
    shadow_batch(f, 1, TRUE_W, TRUE_W)
    for version in (2, 3):
        f.publish(version, TRUE_W * 5)
    shadow_batch(f, 4, TRUE_W * 5, TRUE_W)
    assert f.served() is None and f.guard.candidate is None
    shadow_batch(f, 5, TRUE_W * 5, TRUE_W)
    assert f.guard.candidate is not None and f.guard.candidate.version == 5


def test_a_new_lineage_starts_the_shadow_over(tmp_path: Path) -> None:
    f = Fixture(tmp_path, None, window=64, margin=0.2)
    shadow_batch(f, 1, TRUE_W, TRUE_W)
    s = Snapshot("m", 7, ((TRUE_W * 5).astype(np.float32),), time.time(), 7, lineage="L2")
    f.slot.publish(s)
    x = RNG.normal(size=(64, 3)).astype(np.float32)
    f.guard.handle(ScoredBatch(x, x @ TRUE_W, np.ones(64, np.float32), 7))
    assert f.guard.candidate is s and f.events == []


def test_a_few_samples_far_off_for_both_do_not_decide_the_window(tmp_path: Path) -> None:
    """A broken sensor's message, scored before it is learned, is far off for every version:
    its few samples do not make the difference significant (winsorized differences)."""
    f = Fixture(tmp_path, None, window=256, margin=0.1)
    shadow_batch(f, 1, TRUE_W + 0.2, TRUE_W)
    newest = TRUE_W + np.array([[0.1], [-0.05], [0.05]], np.float32)  # better on normal inputs
    f.publish(2, newest)
    x = RNG.normal(size=(256, 3)).astype(np.float32)
    x[:8] = [1000.0, -1000.0, 0.0]  # the newest is 150 off on these, the candidate exact
    f.guard.handle(ScoredBatch(x, x @ TRUE_W, np.ones(256, np.float32), 2))
    assert f.served() is None and f.events == []


def test_a_classifier_only_more_or_less_confident_is_not_held(tmp_path: Path) -> None:
    """Noisy labels (10 % flipped), the newer versions less confident than the first (the scale
    of their logits), as online training makes them: most samples' losses rise together, so a
    median (or a sign test) calls them worse, while on the mean, a proper score, they are
    better (the flipped labels); serving is never held back."""

    def probability(s: Snapshot, x: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-(x @ s.weights[0])))

    f = Fixture(tmp_path, None, probability, numpy_losses("binary_crossentropy"), window=256)
    rng = np.random.default_rng(5)
    for version in range(1, 20):  # the newer versions less confident than the first
        f.publish(version, TRUE_W * (0.9 if version == 1 else 0.6))
        x = rng.normal(size=(128, 3)).astype(np.float32)
        y = (x @ TRUE_W > 0).astype(np.float32)
        flipped = rng.random(128) < 0.1
        y[flipped] = 1 - y[flipped]
        f.guard.handle(ScoredBatch(x, y, np.ones(128, np.float32), version))
    assert f.served() is None and f.events == []


def test_the_paired_t_statistic_is_robust_to_a_few_far_differences() -> None:
    rng = np.random.default_rng(3)
    noise = rng.normal(0, 1, 256)
    assert abs(paired_t(noise)) < 3
    assert paired_t(noise + 0.5) > 3  # a consistent difference
    far = noise.copy()
    far[:10] = 1e6  # ten samples far off: winsorized away
    assert paired_t(far) < 3
    assert paired_t(np.array([1.0, 1.0, 1.0])) == float("inf")
    assert paired_t(np.array([0.1, np.inf])) == float("inf")  # a non-finite newest loss
    assert paired_t(np.array([0.5])) == 0.0


def write_reference(path: Path, truth: np.ndarray) -> None:
    """A reference CSV of 200 samples of ``truth`` (written whole, then renamed over)."""
    x = RNG.normal(size=(200, 3)).astype(np.float32)
    partial = path.with_suffix(".tmp")
    np.savetxt(partial, np.hstack([x, x @ truth]), delimiter=",")
    partial.replace(path)


def test_a_replaced_reference_file_is_read_again_and_releases_a_stale_hold(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A real drift makes the reference set stale and the guard holds the old concept; the
    operator writes a reference set of the new concept, and the guard scores on it from the
    next version: the held one is scored again on it, the newest is better, serving follows."""
    path = tmp_path / "reference.csv"
    write_reference(path, TRUE_W)
    f = Fixture(tmp_path / "book", ReferenceFile(path, [3], [1]))
    f.publish(1, TRUE_W)
    f.publish(2, -TRUE_W)  # the stream drifted for real; the old set calls it worse
    assert f.served() == 1
    path.write_text("1,2\n")  # a broken new file: logged, the old set kept
    with caplog.at_level("WARNING", logger="livefit.server.serve.guard"):
        f.publish(3, -TRUE_W)
    assert f.served() == 1 and "cannot be used" in caplog.text
    write_reference(path, -TRUE_W)  # the operator's refreshed set
    f.publish(4, -TRUE_W)
    assert f.served() is None
    actions = [e["action"] for e in f.events]
    assert actions == ["hold", "reference_reloaded", "release"]
    assert len(f.guard.scores) == 2  # the held one rescored and the newest: none from before
