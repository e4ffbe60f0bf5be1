"""Calling a traced TensorFlow graph through its flat entry point, without the argument
binding and casting ``ConcreteFunction.__call__`` repeats on every call. Used by the trainer's
step (``train.train_step``) and the serving model (``serve.serving``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf


def flat_caller(concrete: Any) -> Callable[[list[object]], list[tf.Tensor]] | None:
    """Call the traced graph with tensors in signature order, skipping the argument binding
    and casting that ``ConcreteFunction.__call__`` repeats on every call (a tenth of a small
    model's training step: docs/benchmarks/defaults.md).

    ``_call_flat`` is TensorFlow's own internal entry point (what ``__call__`` ends in), not a
    public API: when a TensorFlow version lacks it, None, and the public call is used.
    ``tests/unit/train/test_train_step_paths.py`` checks both paths give the same results.

    Numpy arguments become tensors through ``numpy_to_tensor`` (7 us against 17-22 us for
    ``tf.convert_to_tensor``, whose dispatch and conversion registry a step of 7 arguments
    paid 0.1 ms for); anything else through ``tf.convert_to_tensor``.
    """
    call_flat = getattr(concrete, "_call_flat", None)
    captured = getattr(concrete, "captured_inputs", None)
    if call_flat is None or captured is None:
        return None
    dtypes = [spec.dtype for spec in concrete.structured_input_signature[0]]
    convert = numpy_converter()

    def call(args: list[object]) -> list[tf.Tensor]:
        tensors = [
            convert(a, d) if type(a) is np.ndarray else tf.convert_to_tensor(a, dtype=d)
            for a, d in zip(args, dtypes, strict=True)
        ]
        return call_flat(tensors, captured)

    return call


def numpy_converter() -> Callable[[np.ndarray, tf.DType], tf.Tensor]:
    """``convert(array, dtype)``: an eager tensor on the current device, as
    ``tf.convert_to_tensor`` makes one for a numpy array (its last step, called directly).

    ``EagerTensor`` and the eager context are TensorFlow internals: where a version lacks them,
    ``tf.convert_to_tensor`` itself.
    """
    try:
        from tensorflow.python.eager import context
        from tensorflow.python.framework.ops import EagerTensor

        ctx = context.context()
        ctx.ensure_initialized()
        EagerTensor(np.zeros(1, np.float32), ctx.device_name, tf.float32.as_datatype_enum)
    except Exception:  # pragma: no cover - depends on the TensorFlow version
        return lambda array, dtype: tf.convert_to_tensor(array, dtype=dtype)

    def convert(array: np.ndarray, dtype: tf.DType) -> tf.Tensor:
        return EagerTensor(array, ctx.device_name, dtype.as_datatype_enum)

    return convert
