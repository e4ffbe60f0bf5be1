"""The serving copy computing past versions (``ServingModel.predict_version``): what a version
answers by number equals what it answered when it was current, on every runtime, and the
newest weights' runtime is never disturbed."""

from __future__ import annotations

import numpy as np
import pytest

from livefit.models.builders import build_model
from livefit.server.serve.serving import ServingModel
from livefit.server.wire.snapshot import Snapshot

SIZES = [1, 2, 4, 8]


def versions_of(model_weights: list[np.ndarray], count: int) -> list[Snapshot]:
    rng = np.random.default_rng(5)
    found = []
    for v in range(1, count + 1):
        weights = tuple((w + rng.normal(size=w.shape)).astype(w.dtype) for w in model_weights)
        found.append(Snapshot("m", v, weights, 0.0, 0))
    return found


@pytest.mark.parametrize("runtime", ["numpy", "keras"])
def test_a_past_version_answers_what_it_answered_when_current(runtime: str) -> None:
    model = build_model("mlp", [3], [2], {"hidden_units": [8]}, seed=1)
    snapshots = versions_of(model.get_weights(), 3)
    current: list[Snapshot] = [snapshots[0]]
    serving = ServingModel("m", model, [3], SIZES, lambda: current[0], "/CPU:0", runtime=runtime)
    assert serving.runtime.name == runtime
    serving.warm_up()
    rows = np.random.default_rng(2).normal(size=(5, 3)).astype(np.float32)
    when_current = {}
    for snapshot in snapshots:
        current[0] = snapshot
        outputs, version = serving.predict(rows)
        when_current[version] = outputs
    assert serving.version == 3
    for version in (1, 2, 1, 3):  # the past runtime's weights change with the version asked
        outputs, answered = serving.predict_version(rows, snapshots[version - 1])
        assert answered == version
        np.testing.assert_array_equal(outputs, when_current[version])
    newest, version = serving.predict(rows)  # the newest's runtime was never touched
    assert version == 3
    np.testing.assert_array_equal(newest, when_current[3])
    assert serving._past is not None and serving._past is not serving.runtime


def test_a_network_that_cannot_be_cloned_swaps_on_the_serving_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = build_model("linear", [3], [1], seed=1)
    snapshots = versions_of(model.get_weights(), 2)
    current = [snapshots[0]]
    serving = ServingModel("m", model, [3], SIZES, lambda: current[0], "/CPU:0",
                           runtime="keras")  # fmt: skip

    def refuse(*_: object) -> None:
        raise ValueError("cannot clone")

    monkeypatch.setattr("livefit.server.serve.serving.second_runtime", refuse)
    rows = np.ones((2, 3), dtype=np.float32)
    first, _ = serving.predict(rows)
    current[0] = snapshots[1]
    newest, _ = serving.predict(rows)
    past, version = serving.predict_version(rows, snapshots[0])
    assert version == 1
    np.testing.assert_array_equal(past, first)
    np.testing.assert_array_equal(serving.predict(rows)[0], newest)  # the newest put back
