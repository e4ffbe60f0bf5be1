"""Several devices, the parts a test process can check without splitting its CPU (which only a
fresh process can do: the mirrored step itself is tested in ``tests/e2e/test_devices.py``):
the padding, why a zero-weight row adds nothing, the ``tensorflow.devices`` setting and which
devices a model trains on."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from livefit.server.config.sections import TensorFlowSettings
from livefit.server.config.settings import ConfigError, load_settings
from livefit.server.train.modeling import check_devices, training_placement
from livefit.server.train.placement import Placement, pad_rows
from tests.unit.config.test_settings import MINIMAL, write


def test_pad_rows_appends_zero_weight_rows_up_to_a_multiple() -> None:
    x = np.arange(14, dtype=np.float32).reshape(7, 2) + 1
    y = np.ones((7, 1), np.float32)
    w = np.full(7, 0.5, np.float32)
    px, py, pw = pad_rows(x, y, w, 2)
    assert px.shape == (8, 2) and py.shape == (8, 1) and pw.shape == (8,)
    np.testing.assert_array_equal(px[:7], x)
    assert not px[7].any() and not py[7].any() and pw[7] == 0.0
    assert px.dtype == x.dtype and pw.dtype == w.dtype
    assert [len(pad_rows(x[:n], y[:n], w[:n], 3)[0]) for n in range(1, 8)] == [3, 3, 3, 6, 6, 6, 9]
    same = pad_rows(x[:6], y[:6], w[:6], 2)
    assert same[0] is not None and len(same[0]) == 6


def test_zero_weight_rows_add_nothing_to_the_loss_or_its_gradient() -> None:
    """The step's loss, sum(per-sample loss * weight) / real rows, of a padded batch has the
    unpadded batch's value and gradient (the padded rows' predictions are not zero)."""
    keras.utils.set_random_seed(2)
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(4, "tanh"), keras.layers.Dense(1)]
    )
    loss_fn = keras.losses.get("mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 3)).astype(np.float32)
    y = rng.normal(size=(5, 1)).astype(np.float32)
    w = rng.uniform(0.5, 2.0, size=5).astype(np.float32)

    def loss_and_gradient(x, y, w):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(loss_fn(y, model(x)) * w) / 5.0
        return loss.numpy(), [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]

    plain_loss, plain = loss_and_gradient(x, y, w)
    padded_loss, padded = loss_and_gradient(*pad_rows(x, y, w, 4))
    assert padded_loss == pytest.approx(plain_loss, rel=1e-6)
    for a, b in zip(plain, padded, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["GPU:0", "GPU:1"], ["/GPU:0", "/GPU:1"]),
        (["/device:cpu:1", "/CPU:0"], ["/CPU:1", "/CPU:0"]),
        ("auto", "auto"),
    ],
)
def test_device_names_are_normalised(given, expected) -> None:
    assert TensorFlowSettings(devices=given).devices == expected


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('devices = ["GPU:0", "/device:GPU:0"]', "/GPU:0 named more than once"),
        ('devices = ["TPU:0"]', "'TPU:0' is not a device name"),
        ("devices = []", "name at least one device"),
        ('devices = "all"', "devices"),
        ("logical_cpu_devices = 65", "logical_cpu_devices"),
    ],
)
def test_bad_device_settings_name_the_key(tmp_path: Path, line: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, f"[tensorflow]\n{line}\n{MINIMAL}"), environ={})
    assert "tensorflow.devices" in str(caught.value) or "logical_cpu_devices" in str(caught.value)
    assert message in str(caught.value)


def test_which_devices_a_model_trains_on() -> None:
    """Without GPUs ``auto`` is today's one device; a model's own ``device`` pins it."""
    assert training_placement(TensorFlowSettings(), "auto").devices == ("/CPU:0",)
    listed = TensorFlowSettings(devices=["CPU:0", "GPU:1"])
    assert training_placement(listed, "/CPU:0").devices == ("/CPU:0",)
    one = training_placement(TensorFlowSettings(devices=["CPU:0"]), "auto")
    assert one.devices == ("/CPU:0",) and one.strategy is None and one.replicas == 1


def test_a_device_tensorflow_does_not_see_is_a_config_error() -> None:
    check_devices(TensorFlowSettings(devices=["CPU:0"]))
    with pytest.raises(ConfigError, match=r"/GPU:7 not found; TensorFlow sees /CPU:0"):
        check_devices(TensorFlowSettings(devices=["CPU:0", "GPU:7"]))


def test_a_placement_needs_a_device() -> None:
    with pytest.raises(ValueError):
        Placement([])
