"""Importing TensorFlow in a livefit process without the start-up noise of a machine with no GPU.

TensorFlow's CUDA stub logs through absl before anything can configure absl, so
``TF_CPP_MIN_LOG_LEVEL`` does not reach it: every process wrote "All log messages before
absl::InitializeLog() is called are written to STDERR" and "Could not find cuda drivers on your
machine" twice, then "failed call to cuInit: ... CUDA error" at ERROR level. ``import_tensorflow``
imports TensorFlow and lists its GPUs (the cuInit call) with file descriptor 2 going through a
filter process (``python -m livefit.server.base.tensorflow_start``) that drops exactly those
lines and passes every other byte on. The cuInit failure is dropped only after the stub said
it found no CUDA driver: with a driver installed, it is a real error and stays. The filter reads
its pipe to the end, so what a crash during the import writes still reaches the log. The GPUs
TensorFlow sees are logged once at INFO; device placement is unchanged (``device``,
``tensorflow.devices``).

``exit_without_teardown`` ends a process that has stopped every part of itself without
Python's teardown of TensorFlow's modules: 2.5 s of CPU on one core after the last useful line,
which a split learner's stop waited for in its training process (16 s with two busy loops on
the machine: the serving processes idle meanwhile, the log silent).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO, NoReturn

log = logging.getLogger(__name__)

_ABSL_PREAMBLE = re.compile(
    rb"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
)
_NO_DRIVER = re.compile(
    rb"^I\d{4} [\d:.]+ +\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, "
    rb"GPU will not be used\.$"
)
_CUINIT_FAILED = re.compile(
    rb"^E\d{4} [\d:.]+ +\d+ cuda_platform\.cc:\d+\] failed call to cuInit: "
)


class NoiseFilter:
    """Which stderr lines of TensorFlow's start to keep: all but the absl preamble, the CUDA
    stub's "no driver" line and, after that line, the cuInit failure it implies."""

    def __init__(self) -> None:
        self.no_driver = False

    def keep(self, line: bytes) -> bool:
        text = line.rstrip(b"\r\n")
        if _ABSL_PREAMBLE.match(text):
            return False
        if _NO_DRIVER.match(text):
            self.no_driver = True
            return False
        return not (self.no_driver and _CUINIT_FAILED.match(text))


def filter_stream(source: BinaryIO, sink: BinaryIO, noise: NoiseFilter | None = None) -> None:
    """Copy ``source`` to ``sink`` line by line, without the lines ``noise`` (a new
    ``NoiseFilter`` by default) drops."""
    noise = noise or NoiseFilter()
    for line in source:
        if noise.keep(line):
            sink.write(line)
            sink.flush()


def quiet_tensorflow_env() -> None:
    """TensorFlow's own logging at ERROR and above unless the user set another level; before
    TensorFlow is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@functools.cache
def import_tensorflow() -> tuple[str, ...]:
    """Import TensorFlow quietly (the module docstring) and return the GPUs it sees, logged
    once: the first call in a process does the work (also where TensorFlow was imported before
    it: a fork server imports it for the processes it forks, ``runtime/fork_server.py``), later
    calls return its answer."""
    if "tensorflow" in sys.modules:  # imported without a device (a fork server's child)
        quiet_tensorflow_env()  # this process's environment as a fresh one's: its children's
        with _listing_filtered(no_driver=not _cuda_driver_loads()):  # cuInit's failure alone
            gpus = _visible_gpus()
    else:
        quiet_tensorflow_env()
        with filtered_stderr():  # the import and the device listing (cuInit) are the noisy part
            gpus = _visible_gpus()
    import tensorflow as tf

    if gpus:
        log.info("TensorFlow %s sees %d GPU(s): %s", tf.__version__, len(gpus), ", ".join(gpus))
    else:
        log.info("TensorFlow %s sees no GPU: models run on the CPU", tf.__version__)
    return gpus


def _cuda_driver_loads() -> bool:
    """Whether the CUDA driver library loads: what TensorFlow's CUDA stub said at import
    ("Could not find cuda drivers" when it does not), for a process that did not import it."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _visible_gpus() -> tuple[str, ...]:
    import tensorflow as tf

    return tuple(gpu.name for gpu in tf.config.list_physical_devices("GPU"))


def exit_without_teardown(code: int) -> NoReturn:
    """Flush the logs and standard streams, then end the process with ``code`` at once
    (``os._exit``): for a process whose parts have all stopped (files closed, weights and
    checkpoints written, children stopped), never from a library or a test."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


@contextmanager
def _listing_filtered(no_driver: bool) -> Iterator[None]:
    """File descriptor 2 through ``NoiseFilter`` on a thread of this process for the duration:
    for the device listing alone, a short call, where starting a filter process would cost
    more than the listing (a crash meanwhile may lose what was still in the pipe)."""
    sys.stderr.flush()
    saved = os.dup(2)
    read_end, write_end = os.pipe()
    noise = NoiseFilter()
    noise.no_driver = no_driver

    def copy() -> None:
        with os.fdopen(read_end, "rb") as source, os.fdopen(saved, "wb", closefd=False) as sink:
            filter_stream(source, sink, noise)

    reader = threading.Thread(target=copy, name="livefit-stderr-filter", daemon=True)
    reader.start()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer closed: the reader reaches its end
        reader.join(10)
        if not reader.is_alive():  # else it may still write there: left open
            os.close(saved)


@contextmanager
def filtered_stderr() -> Iterator[None]:
    """File descriptor 2 through the filter process for the duration; as it was without one
    when the filter cannot start."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        noise = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                 stdout=saved)  # fmt: skip
    except OSError:
        os.close(saved)
        yield
        return
    assert noise.stdin is not None
    os.dup2(noise.stdin.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        noise.stdin.close()
        try:
            noise.wait(10)
        except subprocess.TimeoutExpired:  # something started meanwhile holds the pipe open
            noise.kill()
            noise.wait()


if __name__ == "__main__":
    filter_stream(sys.stdin.buffer, sys.stdout.buffer)
