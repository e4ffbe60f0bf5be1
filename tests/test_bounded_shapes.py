"""Compiled shapes stay bounded whatever batch sizes arrive: no retracing growth."""

from __future__ import annotations

import numpy as np

from livefit.models import build_model
from livefit.server.config import ModelSettings
from livefit.server.inference.serving import ServingModel
from livefit.server.ingestion.samples import Batch, SampleQueue
from livefit.server.metrics import Metrics
from livefit.server.snapshot import Snapshot, SnapshotSlot
from livefit.server.training.trainer import Trainer

SIZES = (1, 3, 17, 64, 5, 255, 256, 2, 100)


def test_train_step_is_traced_once() -> None:
    settings = ModelSettings.model_validate(
        {"builder": "mlp", "input_shape": [6], "output_shape": [2]}
    )
    trainer = Trainer("m", settings, SampleQueue(10), SnapshotSlot(), Metrics(), "/CPU:0")
    trainer.warm_up()
    rng = np.random.default_rng(0)
    for n in SIZES:
        x = rng.normal(size=(n, 6)).astype(np.float32)
        trainer.train_batch(Batch(x, x[:, :2].copy(), np.ones(n, np.float32), 1, None, None))
    assert trainer.step.traces == 1


def test_serving_function_is_traced_once_and_padding_never_leaks() -> None:
    model = build_model("linear", [4], [1], seed=0)
    weights = tuple(np.asarray(w) for w in model.get_weights())
    snapshot = Snapshot("m", 1, weights, 0.0, 0)
    serving = ServingModel("m", model, [4], [1, 2, 4, 8, 16, 32], lambda: snapshot, "/CPU:0")
    serving.warm_up()
    rng = np.random.default_rng(1)
    for n in (*SIZES, 33, 70):
        rows = rng.normal(size=(n, 4)).astype(np.float32)
        outputs, version = serving.predict(rows)
        assert outputs.shape == (n, 1) and version == 1
        np.testing.assert_allclose(outputs, rows @ weights[0] + weights[1], rtol=1e-5, atol=1e-6)
    assert serving._traced.experimental_get_tracing_count() == 1
