"""``WeightSubscriber`` (``clients/weights.py``) fed signed messages as the learner signs them,
with no broker: it builds the network from the description alone and predicts what that
network computes, rebuilds when the description changes, refuses what it must not build
(keeping its version), verifies before it builds anything, and says why a wait timed out."""

from __future__ import annotations

import numpy as np
import pytest

from livefit.clients.weights import WeightSubscriber
from livefit.models.builders import build_model
from livefit.models.description import MAX_DESCRIPTION_BYTES
from livefit.server.weights.format import WeightsMeta
from livefit.server.weights.keys import SigningKey
from tests.weight_envelopes import Weights, envelope

ROWS = np.random.default_rng(5).normal(size=(4, 8)).astype(np.float32)
LINEAGE = "b" * 32


def trained(weights: Weights, seed: int) -> Weights:
    """``weights`` with random values, as if trained (scaling statistics away from 0 and 1)."""
    rng = np.random.default_rng(seed)
    arrays = [(rng.normal(size=a.shape) * 0.5 + (a.ndim == 1)).astype(np.float32)
              for a in weights.arrays]  # fmt: skip
    return Weights(weights.names, arrays, weights.description)


def subscriber(signer: SigningKey, **options: object) -> WeightSubscriber:
    """Not started: messages go straight to its verifier (``_process``), as from the broker."""
    return WeightSubscriber("mqtt://127.0.0.1:9", "demo", verify_key=signer.public.base64(),
                            **options)  # type: ignore[arg-type]  # fmt: skip


def send(sub: WeightSubscriber, data: bytes) -> None:
    sub._receiver._process(data)


def expected(weights: Weights, **build: object) -> np.ndarray:
    """What the learner's own network computes for ROWS with these weights."""
    model = build_model("mlp", [8], [1], build.pop("options"), **build)  # type: ignore[arg-type]
    model.set_weights(weights.arrays)
    return np.asarray(model(ROWS))


def test_three_facts_build_the_network_and_predict_as_it_does() -> None:
    """A classifier with input scaling (the case that was refused as ``wrong_architecture``
    unless the caller repeated scaling and loss): built from the description, it predicts what
    the learner's network computes, and each version is announced once in place."""
    signer = SigningKey.generate()
    build = {"options": {"hidden_units": [7, 3], "activation": "relu"},
             "loss": "binary_crossentropy"}  # fmt: skip
    weights = trained(Weights.of("mlp", build["options"], loss="binary_crossentropy"), 1)
    heard: list[WeightsMeta] = []
    sub = subscriber(signer, on_update=heard.append)
    with pytest.raises(RuntimeError, match="no weights yet"):
        sub.predict(ROWS)
    send(sub, envelope(signer, weights, version=3, lineage=LINEAGE))
    assert sub.outcomes == {"accepted": 1} and sub.version == 3
    outputs, version = sub.predict_with_version(ROWS)
    np.testing.assert_allclose(outputs, expected(weights, scaling="standardize", **build),
                               rtol=1e-6, atol=1e-6)  # fmt: skip
    assert version == 3 and [m.version for m in heard] == [3]
    assert ((outputs > 0) & (outputs < 1)).all()  # the sigmoid came with the description
    np.testing.assert_allclose(np.asarray(sub.model(ROWS)), outputs, rtol=1e-6, atol=1e-6)
    assert sub.wait_for_version(3, timeout=0) == 3


def test_another_network_is_built_anew_not_refused() -> None:
    signer = SigningKey.generate()
    small = trained(Weights.of("mlp", {"hidden_units": [4]}), 1)
    large = trained(Weights.of("mlp", {"hidden_units": [9, 9]}), 2)
    sub = subscriber(signer)
    send(sub, envelope(signer, small, version=1, lineage=LINEAGE))
    first = sub.model
    send(sub, envelope(signer, large, version=2, lineage=LINEAGE))
    assert sub.outcomes == {"accepted": 2} and sub.version == 2 and sub.model is not first
    want = expected(large, options={"hidden_units": [9, 9]}, scaling="standardize")
    np.testing.assert_allclose(sub.predict(ROWS), want, rtol=1e-6, atol=1e-6)
    same = trained(Weights.of("mlp", {"hidden_units": [9, 9]}), 3)
    send(sub, envelope(signer, same, version=3, lineage=LINEAGE))
    assert sub.model is not first and sub.version == 3  # the same network: weights loaded


HOSTILE = {
    "Lambda": lambda text: text.replace('"class_name":"Dense"', '"class_name":"Lambda"', 1),
    "TFSMLayer": lambda text: text.replace('"class_name":"Dense"', '"class_name":"TFSMLayer"', 1),
    "module os": lambda text: text.replace('"module":"keras.layers"', '"module":"os"', 1),
    "unregistered": lambda text: text.replace("livefit>Standardize", "evil>Standardize", 1).replace(
        '"module":"livefit.models.standardize"', '"module":"evil"', 1
    ),
    "over 1 MiB": lambda text: text + " " * MAX_DESCRIPTION_BYTES,
    "nested 100,000 deep": lambda text: (
        '{"format":1,"keras":' + "[" * 100_000 + "]" * 100_000 + "}"
    ),
}


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_description_that_must_not_be_built_is_refused_and_the_version_kept(
    hostile: str,
) -> None:
    """Signed by the learner's key and still refused; the version held keeps answering."""
    signer = SigningKey.generate()
    good = trained(Weights.of("mlp", {"hidden_units": [4]}), 1)
    sub = subscriber(signer)
    send(sub, envelope(signer, good, version=1, lineage=LINEAGE))
    before = sub.predict(ROWS)
    text = HOSTILE[hostile](good.description)
    assert text != good.description
    send(sub, envelope(signer, Weights(good.names, good.arrays, text), version=2, lineage=LINEAGE))
    assert sub.outcomes == {"accepted": 1, "bad_description": 1} and sub.version == 1
    assert str(sub._receiver.last_refused).startswith("bad_description")
    np.testing.assert_array_equal(sub.predict(ROWS), before)


def test_nothing_is_built_before_the_signature_verifies(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    monkeypatch.setattr("livefit.clients.weights.model_from_description", built.append)
    signer, attacker = SigningKey.generate(), SigningKey.generate()
    weights = trained(Weights.of("mlp", {"hidden_units": [4]}), 1)
    sub = subscriber(signer)
    send(sub, envelope(attacker, weights, version=5, lineage=LINEAGE))
    send(sub, envelope(None, weights, version=6, lineage=LINEAGE))
    assert sub.outcomes == {"bad_signature": 1, "unsigned": 1} and built == []


def test_a_learner_without_descriptions_needs_the_model() -> None:
    signer = SigningKey.generate()
    weights = trained(Weights.of("mlp", {"hidden_units": [4]}), 1)
    old = Weights(weights.names, weights.arrays)  # as a learner before descriptions sends it
    sub = subscriber(signer)
    send(sub, envelope(signer, old, version=1, lineage=LINEAGE))
    assert sub.outcomes == {"bad_description": 1} and sub.version is None
    model = build_model("mlp", [8], [1], {"hidden_units": [4]}, scaling="standardize")
    sub = subscriber(signer, model=model)
    send(sub, envelope(signer, old, version=1, lineage=LINEAGE))
    assert sub.outcomes == {"accepted": 1} and sub.model is model
    want = expected(weights, options={"hidden_units": [4]}, scaling="standardize")
    np.testing.assert_allclose(sub.predict(ROWS), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(model(ROWS)), want, rtol=1e-6, atol=1e-6)


def test_a_wait_that_times_out_raises_and_says_why() -> None:
    signer, attacker = SigningKey.generate(), SigningKey.generate()
    sub = subscriber(signer)
    send(sub, envelope(attacker, Weights.of("linear"), version=1, lineage=LINEAGE))
    with pytest.raises(TimeoutError, match=r"no version 1 within 0\.2 s.*bad_signature"):
        sub.wait_for_version(1, timeout=0.2)
    with pytest.raises(TimeoutError):
        sub.wait_for(lambda s: s.lineage == "x", timeout=0.1)


def test_the_old_positional_call_says_what_changed() -> None:
    model = build_model("linear", [8], [1])
    with pytest.raises(TypeError, match="positional"):
        WeightSubscriber(model, "mqtt://127.0.0.1:9", "demo", verify_key="x")  # type: ignore[misc]
    with pytest.raises(TypeError, match="model="):
        WeightSubscriber(model, "demo", verify_key="x")  # type: ignore[arg-type]
