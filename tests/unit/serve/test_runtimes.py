"""Every serving runtime answers what Keras answers, swaps versions between batches only, and a
model a runtime cannot take falls back to the graph runtime with one log line."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from livefit.models.builders import build_model
from livefit.server.serve.runtimes import (
    AGREEMENT_TOLERANCE,
    GraphRuntime,
    NumpyRuntime,
    build_runtime,
)
from livefit.server.serve.serving import ServingModel
from livefit.server.wire.snapshot import Snapshot

# name -> (builder, input shape, output shape, options, loss)
MODELS = {
    "mlp": ("mlp", [8], [1], {"hidden_units": [64, 64]}, "mse"),
    "lstm": ("lstm", [16, 8], [1], {"units": 64}, "mse"),
    "linear": ("linear", [3, 4], [2], {}, "mse"),
    "mlp_softmax_2d": (
        "mlp",
        [5],
        [2, 3],
        {"hidden_units": [7], "dropout": 0.2, "activation": "tanh"},
        "categorical_crossentropy",
    ),
    "mlp_sigmoid": ("mlp", [4], [1], {"hidden_units": [6]}, "binary_crossentropy"),
}
# the runtime each model gets from "numpy" and from "auto"
NUMPY_TAKES = {"mlp", "linear", "mlp_softmax_2d", "mlp_sigmoid"}


def _model(name: str):
    builder, ins, outs, options, loss = MODELS[name]
    return build_model(builder, ins, outs, options, seed=3, scaling="standardize", loss=loss)


def _other_weights(model, seed: int) -> tuple[np.ndarray, ...]:
    """Weights unlike the initial ones: scaling statistics away from the identity included."""
    rng = np.random.default_rng(seed)
    out = []
    for w in model.get_weights():
        new = rng.normal(scale=0.5, size=w.shape).astype(np.float32)
        out.append(np.abs(new) + 0.5 if w.shape and np.all(w == 1) else new)  # std > 0
    return tuple(out)


def _keras_outputs(reference, weights: tuple[np.ndarray, ...], rows: np.ndarray) -> np.ndarray:
    """What Keras answers for ``rows`` with ``weights``: ``reference`` is a model of its own,
    built once per test (building one per call cost most of the test's time)."""
    reference.set_weights(list(weights))
    return np.asarray(reference(rows, training=False))


@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.parametrize("choice", ["keras", "xla", "numpy", "auto"])
def test_runtime_answers_what_keras_answers_for_two_versions(choice: str, model_name: str) -> None:
    model = _model(model_name)
    _, ins, _, _, _ = MODELS[model_name]
    v1, v2 = _other_weights(model, 1), _other_weights(model, 2)
    current = {"snapshot": Snapshot("m", 1, v1, 0.0, 0)}
    serving = ServingModel(
        "m", model, ins, [1, 2, 4, 8], lambda: current["snapshot"], "/CPU:0", runtime=choice
    )
    serving.warm_up()
    if choice == "xla" or (choice == "numpy" and model_name in NUMPY_TAKES):
        assert serving.runtime.name == choice  # not the fallback
    rows = np.random.default_rng(5).standard_normal((11, *ins)).astype(np.float32)
    reference = _model(model_name)
    for version, weights in ((1, v1), (2, v2)):
        current["snapshot"] = Snapshot("m", version, weights, 0.0, 0)
        for n in (1, 3, 11):  # 11: more than the largest batch size, in two parts
            outputs, answered = serving.predict(rows[:n])
            assert answered == version
            expected = _keras_outputs(reference, weights, rows[:n])
            print(choice, model_name, version, n, float(np.abs(outputs - expected).max()))
            assert outputs.dtype == np.float32 and outputs.shape == expected.shape
            np.testing.assert_allclose(outputs, expected, **AGREEMENT_TOLERANCE)


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_auto_takes_numpy_for_a_dense_chain_and_keras_otherwise(model_name: str) -> None:
    _, ins, _, _, _ = MODELS[model_name]
    runtime = build_runtime("auto", _model(model_name), ins, "/CPU:0")
    expected = "numpy" if model_name in NUMPY_TAKES else "keras"
    assert runtime.name == expected


def test_numpy_cannot_take_an_lstm_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="livefit.server.serve.runtimes"):
        runtime = build_runtime("numpy", _model("lstm"), [16, 8], "/CPU:0")
    assert isinstance(runtime, GraphRuntime) and runtime.name == "keras"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "LSTM" in lines[0] and "serving with keras" in lines[0], lines


def test_a_branching_model_is_not_a_chain() -> None:
    """Two Dense layers on the same input, added: every layer is supported, the graph is not a
    single chain, so NumPy must refuse it rather than compute something else."""
    import keras

    inputs = keras.Input((4,))
    added = keras.layers.Add()([keras.layers.Dense(3)(inputs), keras.layers.Dense(3)(inputs)])
    model = keras.Model(inputs, keras.layers.Dense(1)(added))
    runtime = build_runtime("numpy", model, [4], "/CPU:0")
    assert runtime.name == "keras"


def test_numpy_runtime_reads_the_snapshot_arrays_without_copying_them() -> None:
    model = _model("mlp")
    weights = _other_weights(model, 4)
    runtime = NumpyRuntime(model)
    runtime.load(weights)
    assert all(a is b for a, b in zip(runtime.params, weights, strict=True))


def test_numpy_runtime_refuses_weights_of_another_shape() -> None:
    runtime = NumpyRuntime(_model("mlp"))
    with pytest.raises(ValueError, match="shapes"):
        runtime.load(_other_weights(_model("linear"), 1))


def test_an_unknown_runtime_is_refused() -> None:
    with pytest.raises(ValueError, match=r"serve\.runtime"):
        build_runtime("onnx", _model("mlp"), [8], "/CPU:0")


def _served(runtime: str, current: dict[str, Snapshot]):
    from livefit.server.config.model import ModelSettings
    from livefit.server.serve.endpoint import ModelEndpoint

    settings = ModelSettings.model_validate(
        {"builder": "mlp", "input_shape": [8], "output_shape": [1],
         "builder_options": {"hidden_units": [64, 64]}, "scaling": "standardize",
         "serve": {"max_batch_size": 8, "runtime": runtime}}
    )  # fmt: skip
    model = _model("mlp")
    serving = ServingModel(
        "m", model, [8], settings.serve.batch_sizes(), lambda: current["snapshot"], "/CPU:0",
        runtime=runtime,
    )  # fmt: skip
    serving.warm_up()
    return ModelEndpoint("m", settings, serving)


@pytest.mark.parametrize("runtime", ["numpy", "keras"])
def test_a_cheap_model_is_called_on_the_loop_and_swaps_there_between_batches(
    runtime: str,
) -> None:
    """The NumPy runtime's call is cheaper than a thread hand-over: the batcher calls it on
    the event loop, and a new snapshot is swapped in there, between batches; the graph runtime
    keeps its model thread. Either way each answer carries the version that computed it."""
    import asyncio
    import threading

    from livefit.server.base.metrics import Metrics

    model = _model("mlp")
    versions = {v: _other_weights(model, v) for v in (1, 2)}
    current = {"snapshot": Snapshot("m", 1, versions[1], 0.0, 0)}
    served = _served(runtime, current)
    rows = np.random.default_rng(6).standard_normal((3, 8)).astype(np.float32)
    callers: set[int] = set()
    predict = served.serving.predict

    def spy(batch: np.ndarray):
        callers.add(threading.get_ident())
        return predict(batch)

    served.serving.predict = spy  # type: ignore[method-assign]

    async def main() -> list[tuple[int, np.ndarray]]:
        served.start_batching(Metrics())
        assert served.batcher is not None
        answers = []
        try:
            for version in (1, 2):
                current["snapshot"] = Snapshot("m", version, versions[version], 0.0, 0)
                served.snapshot_arrived()
                await asyncio.sleep(0.05)  # the swap queued on the model thread runs
                results = await asyncio.gather(
                    *(served.batcher.submit(rows[i : i + 1], 30.0) for i in range(3))
                )
                answers += [(r.version, r.outputs) for r in results]
            return answers
        finally:
            await served.stop_batching()

    loop_thread = threading.get_ident()
    answers = asyncio.run(main())
    assert (callers == {loop_thread}) == (runtime == "numpy"), (callers, loop_thread)
    assert served.serving.runs_inline() == (runtime == "numpy")
    reference = _model("mlp")
    for i, (version, outputs) in enumerate(answers):
        expected = _keras_outputs(reference, versions[version], rows[i % 3 : i % 3 + 1])
        assert version == (1 if i < 3 else 2)
        np.testing.assert_allclose(outputs, expected, **AGREEMENT_TOLERANCE)
