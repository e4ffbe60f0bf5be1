"""The learner's guard (``runtime.learner``): built after the book when ``guard.enabled``, it
scores versions with a runtime of its own (never the trainer's network), refuses a loss it cannot
score, and its thread ends with the learner."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest


def learner_and_model(tmp_path: Path, **model: Any) -> tuple[Any, Any]:
    from livefit.server.config.settings import Settings
    from livefit.server.runtime.learner import LearnerRuntime, ModelRuntime
    from livefit.server.train.modeling import build_compiled
    from livefit.server.wire.snapshot import SnapshotSlot

    reference = tmp_path / "reference.csv"
    rows = np.random.default_rng(1).normal(size=(6, 3)).astype(np.float32)
    np.savetxt(reference, rows, delimiter=",")
    guard: dict[str, Any] = {"enabled": True, "reference_path": str(reference)}
    guard.update(model.pop("guard", {}))
    models = {"m": {"input_shape": [2], "output_shape": [1], "guard": guard, **model}}
    settings = Settings.model_validate({"models": models, "storage": {"dir": str(tmp_path)}})
    network = build_compiled(settings.models["m"], "/CPU:0")
    runtime = ModelRuntime(
        "m", settings.models["m"], "/CPU:0", queue=None, slot=SnapshotSlot(),  # type: ignore[arg-type]
        trainer=SimpleNamespace(model=network, stop=lambda: None, samples_seen=0), book=SimpleNamespace(versions={}),  # type: ignore[arg-type]
    )  # fmt: skip
    learner = LearnerRuntime(settings)
    learner.models["m"] = runtime
    return learner, runtime


def test_the_guard_scores_versions_on_a_copy_of_its_own_and_stops_with_the_learner(
    tmp_path: Path,
) -> None:
    from livefit.server.wire.snapshot import Snapshot

    learner, runtime = learner_and_model(tmp_path)
    guard = learner._guard(runtime)
    assert guard is not None and len(guard.reference.x) == 6
    network = runtime.trainer.model
    trained = [np.array(w) for w in network.get_weights()]
    other = tuple(np.full_like(w, 0.5) for w in trained)
    x = guard.reference.x
    found = guard.predict(Snapshot("m", 2, other, time.time(), 0), x)
    network.set_weights(list(other))
    np.testing.assert_allclose(found, network(x).numpy(), rtol=1e-5, atol=1e-6)
    network.set_weights(trained)
    found = guard.predict(Snapshot("m", 1, tuple(trained), time.time(), 0), x)
    np.testing.assert_allclose(found, network(x).numpy(), rtol=1e-5, atol=1e-6)

    runtime.guard = guard
    guard.start()
    assert any(t.name == "guard-m" for t in threading.enumerate())
    learner.stop()
    assert runtime.guard is None
    assert not any(t.name == "guard-m" for t in threading.enumerate())


def test_the_guard_is_not_built_when_off_and_refuses_a_loss_it_cannot_score(
    tmp_path: Path,
) -> None:
    learner, runtime = learner_and_model(tmp_path, loss="huber")
    with pytest.raises(ValueError, match="cannot score loss 'huber'"):
        learner._guard(runtime)
    runtime.settings = runtime.settings.model_copy(
        update={"guard": runtime.settings.guard.model_copy(update={"enabled": False})}
    )
    assert learner._guard(runtime) is None


def test_without_a_reference_set_the_guard_is_fed_every_batch_the_trainer_learns(
    tmp_path: Path,
) -> None:
    from livefit.server.runtime.learner import LearnerHooks
    from livefit.server.serve.guard import ScoredBatch
    from livefit.server.wire.samples import Batch

    learner, runtime = learner_and_model(tmp_path, guard={"reference_path": None})
    guard = learner._guard(runtime)
    assert guard is not None and guard.reference is None
    offered: list[ScoredBatch] = []
    guard._worker.offer = offered.append  # type: ignore[method-assign]
    hooks = LearnerHooks(learner, runtime)
    x = np.ones((3, 2), np.float32)
    batch = Batch(x, np.zeros((3, 1), np.float32), np.ones(3, np.float32), 1, None, None)
    hooks.batch_learned(batch, 7)  # no guard on the runtime yet: nothing
    assert offered == []
    runtime.guard = guard
    hooks.batch_learned(batch, 7)
    assert len(offered) == 1 and offered[0].version == 7 and offered[0].x is x
    guard.snapshot_arrived(None)  # type: ignore[arg-type]  # a snapshot is the reference side's
    assert len(offered) == 1
