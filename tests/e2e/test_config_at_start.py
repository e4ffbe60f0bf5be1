"""Configuration errors as a user meets them: a real ``livefit serve`` exits 2 with one line
naming the key, before TensorFlow is imported and before anything is subscribed; TensorFlow's
thread pools are sized from ``[tensorflow]`` in a fresh process. The settings themselves:
``tests/unit/config/test_settings.py``."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from livefit.server.config.topic_filters import topic_problem
from tests.configs import learner_config, model
from tests.unit.config.test_settings import MINIMAL, toml_string, write


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


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ("weights", "topic"),
        ("", "dead_letter_topic"),
        ("labels", "predictions_topic"),
        ("", "topic"),
    ],
)
def test_livefit_serve_refuses_a_control_character_in_a_topic(
    tmp_path: Path, broker, table: str, key: str
) -> None:
    """``weights.topic = "livefit/demo/weights\\t"`` (or a dead-letter topic with U+007F)
    used to load and run: mosquitto dropped the connection at every publish (issue 45). Now
    exit 2 with one line naming the key, before anything connects."""
    topic = "livefit/ctl/weights\t" if key != "dead_letter_topic" else "livefit/ctl/dead\x7f"
    line = f"{key} = {toml_string(topic)}"
    tables = {table: line} if table else {}
    text = learner_config(broker, tmp_path / "data", "ctl",
                          model("ctl", lines="" if table else line, **tables))  # fmt: skip
    path = write(tmp_path, text)
    done = subprocess.run(
        [sys.executable, "-m", "livefit", "serve", "--config", str(path), "--port", "0"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    name = ".".join(part for part in ("models.ctl", table, key) if part)
    character = topic[-1]
    assert done.stderr.strip().splitlines() == [
        f"livefit: invalid configuration ({path}): {name}: {topic!r} is not an MQTT topic"
        f"{' filter' if key == 'topic' and not table else ' to publish on'}: a control "
        f"character (U+{ord(character):04X}) at character {len(topic)}: MQTT brokers refuse it "
        "(mosquitto disconnects)"
    ]
    assert not (tmp_path / "data").exists(), "refused before the storage dir was made"


def _broker_takes(broker, topic: str) -> bool:
    """Whether a real mosquitto takes a QoS 1 PUBLISH on ``topic`` (it disconnects instead)."""
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    dropped: list[str] = []
    client.on_disconnect = lambda _c, _u, _f, reason, _p: dropped.append(str(reason))
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        info = client.publish(topic, b"x", qos=1)
        info.wait_for_publish(2)
        return info.is_published() and not dropped
    except RuntimeError:
        return False
    finally:
        client.disconnect()
        client.loop_stop()


@pytest.mark.parametrize(
    "character",
    ["\t", "\n", "\x1b", "\x7f", "\x85", "\x9f", "\ufdd0", "\ufdef", "\ufffe", "\U0001ffff",
     "\U0010fffe", "\xa0", "\u200b", "\ufeff", "\ufffd", "\U0001f600", "\ufdcf", "\ufdf0"],
)  # fmt: skip
def test_the_characters_refused_at_load_are_those_mosquitto_refuses(broker, character: str) -> None:
    """The validator against the broker users run: what mosquitto refuses is refused at
    load, what it takes is accepted."""
    topic = f"livefit/chars/{character}"
    assert (topic_problem(topic) is None) is _broker_takes(broker, topic), repr(character)
