"""TensorFlow's start-up noise filter (``server/base/tensorflow_start.py``) on the lines
TensorFlow 2.21 writes on a machine with no GPU, and on lines that must pass. Through a real
``livefit serve``: ``tests/e2e/test_learner_group.py``."""

from __future__ import annotations

import io
import logging
import os

import pytest

from livefit.server.base.tensorflow_start import (
    NoiseFilter,
    filter_stream,
    import_tensorflow,
    quiet_tensorflow_env,
)

PREAMBLE = (
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
)
NO_DRIVER = (
    b"I0000 00:00:1795852989.464035   22699 cudart_stub.cc:31] Could not find cuda drivers on "
    b"your machine, GPU will not be used.\n"
)
CUINIT = (
    b"E0000 00:00:1795852996.479730   22699 cuda_platform.cc:52] failed call to cuInit: "
    b"INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n"
)
# What a machine with no GPU wrote while one process imported TensorFlow and listed its GPUs.
NO_GPU_START = [PREAMBLE, NO_DRIVER, PREAMBLE, NO_DRIVER, CUINIT]


def test_the_start_up_noise_of_a_machine_without_a_gpu_is_dropped() -> None:
    sink = io.BytesIO()
    filter_stream(io.BytesIO(b"".join([b"before\n", *NO_GPU_START, b"after"])), sink)
    assert sink.getvalue() == b"before\nafter"


@pytest.mark.parametrize(
    "line",
    [
        b"E0000 00:00:1.0   1 cuda_platform.cc:52] failed call to cuInit: CUDA_ERROR_NO_DEVICE\n",
        b"F0000 00:00:1.0   1 cpu_feature_guard.cc:1] The TensorFlow library was compiled to use "
        b"AVX instructions, but these aren't available on your machine.\n",
        b"E0000 00:00:1.0   1 cuda_dnn.cc:9] Could not create cudnn handle\n",
        b"Traceback (most recent call last):\n",
        b"WARNING: All log messages before absl::InitializeLog() is called are written to a file\n",
    ],
)
def test_every_other_line_passes(line: bytes) -> None:
    """A cuInit failure with a CUDA driver installed (no "no driver" line before it) is a real
    error; so is anything else."""
    assert NoiseFilter().keep(line)


def test_a_cuinit_failure_is_dropped_only_after_the_no_driver_line() -> None:
    noise = NoiseFilter()
    assert noise.keep(CUINIT)
    assert not noise.keep(NO_DRIVER)
    assert not noise.keep(CUINIT)


def test_a_users_tensorflow_log_level_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    quiet_tensorflow_env()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    quiet_tensorflow_env()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"


def test_an_imported_tensorflow_is_not_imported_again_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Where TensorFlow was imported before (the suite's fork server imports it for the
    servers it forks), the first call still says what TensorFlow sees, and only the first."""
    import tensorflow as tf

    import_tensorflow.cache_clear()  # this process's first call
    caplog.set_level(logging.INFO)
    gpus = import_tensorflow()  # no filter process: this test process starts none
    assert gpus == tuple(gpu.name for gpu in tf.config.list_physical_devices("GPU"))
    [record] = caplog.records
    assert record.getMessage().startswith(f"TensorFlow {tf.__version__} sees "), record
    caplog.clear()
    assert import_tensorflow() == gpus
    assert not caplog.records
