"""The serving model (``serve.serving``): compiled shapes stay bounded whatever batch sizes
arrive (no retracing growth), and the traced graph gives the public call's outputs."""

from __future__ import annotations

import numpy as np

from livefit.models.builders import build_model
from livefit.server.serve.serving import ServingModel
from livefit.server.wire.snapshot import Snapshot

SIZES = (1, 3, 17, 64, 5, 255, 256, 2, 100)


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
    assert serving.runtime.traced.experimental_get_tracing_count() == 1


def test_serving_calls_the_traced_graph_directly_with_the_public_call_s_outputs() -> None:
    """The serving call skips the concrete function's per-call argument binding (its flat
    entry), and answers exactly what the public call answers: the same graph, the same
    variables (weights set later included); another dtype takes the public call, which
    converts it."""
    model = build_model("mlp", [8], [3], {"hidden_units": [16]}, seed=2)
    serving = ServingModel("m", model, [8], [1, 4], lambda: None, "/CPU:0")
    assert (
        serving.runtime.flat_call is not serving.runtime.function
    )  # this TensorFlow has the flat entry
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(4, 8)).astype(np.float32)
    np.testing.assert_array_equal(serving.runtime.flat_call(rows), serving.runtime.function(rows))
    model.set_weights([w + 0.5 for w in model.get_weights()])
    np.testing.assert_array_equal(serving.runtime.flat_call(rows), serving.runtime.function(rows))
    np.testing.assert_allclose(serving.runtime.flat_call(rows), np.asarray(model(rows)), rtol=1e-5)
    np.testing.assert_array_equal(
        serving.runtime.flat_call(rows.astype(np.float64)), serving.runtime.function(rows)
    )
