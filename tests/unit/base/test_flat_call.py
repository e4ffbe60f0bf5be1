"""flat_call: numpy arguments become the tensors tf.convert_to_tensor would make."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from livefit.server.base.flat_call import flat_caller, numpy_converter

ARRAYS = {
    "float32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "float64": np.linspace(-1e3, 1e3, 12).reshape(3, 4),
    "int64": np.arange(12).reshape(3, 4),
    "non-contiguous": np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2],
    "scalar": np.asarray(2.5, dtype=np.float32),
    "non-finite": np.array([np.nan, np.inf, -np.inf], dtype=np.float32),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_numpy_converter_matches_convert_to_tensor(name: str) -> None:
    array = ARRAYS[name]
    convert = numpy_converter()
    expected = tf.convert_to_tensor(array, dtype=tf.float32)
    got = convert(array, tf.float32)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got.numpy(), expected.numpy())
    with tf.device("/CPU:0"):
        assert convert(array, tf.float32).device.endswith("CPU:0")


def test_flat_call_gives_what_the_public_call_gives() -> None:
    @tf.function(
        input_signature=[tf.TensorSpec([None, 2], tf.float32), tf.TensorSpec([], tf.float32)]
    )
    def scaled(x: tf.Tensor, k: tf.Tensor) -> tf.Tensor:
        return x * k

    concrete = scaled.get_concrete_function()
    flat = flat_caller(concrete)
    assert flat is not None
    x = np.arange(6, dtype=np.float64).reshape(3, 2)  # cast to the signature's float32
    got = flat([x, np.float32(3.0)])
    np.testing.assert_array_equal(
        np.asarray(got), concrete(tf.constant(x, tf.float32), 3.0).numpy()
    )
