"""Configuration errors as a user meets them: a real ``livefit serve`` exits 2 with one line
naming the key, before TensorFlow is imported and before anything is subscribed; TensorFlow's
thread pools are sized from ``[tensorflow]`` in a fresh process. The settings themselves:
``tests/unit/test_config.py``."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.configs import learner_config, model
from tests.unit.test_config import MINIMAL, write


def test_config_mistakes_stop_livefit_serve_in_one_line(tmp_path: Path) -> None:
    """What a user sees: exit 2, one line naming the key and a suggestion, no traceback,
    before TensorFlow is imported (well under TensorFlow's import time)."""
    path = write(tmp_path, MINIMAL + 'loss = "mse_typo"\n')
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "livefit", "serve", "--config", str(path)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        f"livefit: invalid configuration ({path}): models.demo.loss: unknown loss 'mse_typo'; "
        "did you mean 'mse' or 'MSE'?"
    ]
    assert "Traceback" not in done.stdout + done.stderr
    assert time.monotonic() - started < 20


def test_tensorflow_thread_pools_are_applied_before_the_first_op(tmp_path) -> None:
    """``livefit serve`` sizes TensorFlow's pools from ``[tensorflow]`` (a fresh process:
    TensorFlow only accepts this before its first op)."""
    config = tmp_path / "livefit.toml"
    config.write_text(
        "[tensorflow]\nintra_op_threads = 1\ninter_op_threads = 2\n"
        '[models.m]\nbuilder = "linear"\ninput_shape = [2]\noutput_shape = [1]\n'
    )
    code = (
        "import tensorflow as tf\n"
        "from livefit.server.config.settings import load_settings\n"
        "from livefit.server.train.modeling import configure_tensorflow\n"
        f"configure_tensorflow(load_settings({str(config)!r}, environ={{}}).tensorflow)\n"
        "tf.constant(1.0) + 1.0\n"
        "print(tf.config.threading.get_intra_op_parallelism_threads(),"
        " tf.config.threading.get_inter_op_parallelism_threads())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["1", "2"]


def test_livefit_serve_refuses_to_consume_its_own_output(tmp_path: Path, broker) -> None:
    """The real process on a real broker: exit 2 and one line naming the filter and the topic
    it would consume, before anything is subscribed (it used to run, reading its own retained
    weights and dead-letter reports: 7-8 rejections before any input, then about 1,000 a s)."""
    path = write(
        tmp_path,
        learner_config(
            broker, tmp_path / "data", "loop", model("loop", lines='topic = "livefit/loop/#"')
        ),
    )
    done = subprocess.run(
        [sys.executable, "-m", "livefit", "serve", "--config", str(path), "--port", "0"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        f"livefit: invalid configuration ({path}): models.loop.topic 'livefit/loop/#' would "
        "consume 'livefit/loop/weights', the weights topic livefit publishes for model loop: a "
        "learner must not read its own output; choose topics that do not overlap"
    ]
