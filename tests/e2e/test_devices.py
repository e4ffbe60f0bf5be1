"""Several devices in one learner (``tensorflow.devices``), tested on two logical CPU devices
(``tensorflow.logical_cpu_devices``): the CPU can only be split before TensorFlow initialises,
so every test here runs a process of its own.

- The compiled step mirrored on two devices learns what it learns on one (sizes not divisible
  by two among the batches: zero-weight padding adds nothing), rolls a non-finite batch back,
  keeps every device's copy alike, and either one's state restores on the other.
- A real learner on two devices trains every published sample exactly once (a message of 7
  samples among them), ends where a one-device learner fed the same stream ends, and writes
  snapshots and checkpoints in the same format: the same tensor names, dtypes and shapes, and
  each one's checkpoint restores on the other and predicts the same.
- A device TensorFlow does not see stops ``livefit serve`` with exit 2 and one line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from safetensors.numpy import load_file

from livefit.local_servers import LivefitProcess
from livefit.server.runtime.local_process import quiet_env, stop_all
from livefit.server.runtime.mosquitto import Mosquitto
from livefit.server.weights.format import decode_weights
from tests.configs import learner_config, model
from tests.unit.config.test_settings import write

TWO_DEVICES = '[tensorflow]\ndevices = ["CPU:0", "CPU:1"]\nlogical_cpu_devices = 2\n'
# Float tolerance between one and two devices: the same sums in another order (measured: the
# weights differ by under 1e-7 after 16 steps of the step test, predictions by under 2e-6).
WEIGHTS_ATOL = 1e-4
MESSAGE_SIZES = [7, 1, 8, 13, 3, 5, 2, 16, 9]  # one message a batch (each trained before the next)


def test_the_step_on_two_devices_learns_what_it_learns_on_one() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.e2e.two_devices_steps"],
        capture_output=True, text=True, timeout=300, env=quiet_env(),
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results.pop("dropout_trains") is True
    regularized = results.pop("regularized")
    print("regularized network, largest weight difference:", regularized)
    assert regularized < 1e-5  # a layer loss counted once, not once per device
    for name, r in results.items():
        print(name, "weights", r["weights"], "optimizer", r["optimizer"],
              "predictions", max(r["predictions"]), "loss (relative)", max(r["losses"]))  # fmt: skip
        assert all(one == two for one, two in r["rows"]), (name, r["rows"])
        steps = r["default_steps"]  # every batch caught up: the model's default steps
        assert steps == (2 if name == "mlp-bce" else 4), name
        assert all(one == two == steps for one, two in r["steps"]), (name, r["steps"])
        assert r["weights"] < 1e-5 and r["optimizer"] < 1e-5, name
        assert max(r["predictions"]) < 1e-4 and max(r["losses"]) < 1e-5, name
        assert r["copies_equal"] and r["rolled_back"], name
        assert r["traces"] == [1, 1], name  # one trace whatever the (padded) batch sizes
        assert r["two_to_one"] == r["one_to_two"] == 0.0, name
        assert r["two_to_one_optimizer"] == r["one_to_two_optimizer"] == 0.0, name
        assert r["names_one"] == r["names_two"], name
        if "average" in r:  # weight averaging: the averaged weights alike; a rewind exact
            assert r["average"] < 1e-5 and r["rewound"] is True, name


def learner_text(broker: Mosquitto, storage: Path, client_id: str, devices: int) -> str:
    demo = model(
        builder="mlp", input_shape=(4,),
        lines="builder_options = { hidden_units = [16] }\nlearning_rate = 0.01\nseed = 11",
        train="max_batch_size = 64", weights="publish_interval_s = 0.1\nserve_interval_s = 0.05",
        checkpoint="interval_s = 3600",
    )  # fmt: skip
    text = learner_config(broker, storage, client_id, demo)
    return (TWO_DEVICES if devices == 2 else "") + text


def publish_in_turn(broker: Mosquitto, learners: list[LivefitProcess]) -> int:
    """Publish each message once every learner has trained the one before (one message, one
    batch, the same batches everywhere); the number of samples published."""
    rng = np.random.default_rng(5)
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    published = 0
    try:
        for seq, size in enumerate(MESSAGE_SIZES):
            x = rng.normal(size=(size, 4))
            y = x @ np.array([[1.0], [-2.0], [0.5], [0.0]]) + 3.0
            doc = {"x": x.tolist(), "y": y.tolist(), "seq": seq, "source": "devices"}
            client.publish("livefit/demo/samples", json.dumps(doc), qos=1).wait_for_publish(10)
            published += size
            for learner in learners:
                trained = learner.wait_for_metric(
                    "livefit_train_samples_total", published, timeout=120, model="demo"
                )
                assert trained == published, (learner.name, trained, published)
    finally:
        client.disconnect()
        client.loop_stop()
    return published


def served_snapshot(learner: LivefitProcess, version: float) -> tuple[list[str], list[np.ndarray]]:
    """The names and arrays of the learner's snapshot at ``version`` (over HTTP, as replicas
    and clients download it)."""
    deadline = time.monotonic() + 60
    while True:
        response = httpx.get(f"{learner.url}/v1/models/demo/weights", timeout=10)
        if response.status_code == 200 and float(response.headers["X-Model-Version"]) >= version:
            names, arrays, _ = decode_weights(response.content)
            return names, arrays
        assert time.monotonic() < deadline, (response.status_code, response.headers)
        time.sleep(0.1)


def newest_checkpoint(storage: Path) -> dict[str, np.ndarray]:
    return load_file(max((storage / "checkpoints" / "demo").glob("ckpt-*.safetensors"),
                         key=lambda p: int(p.stem.split("-")[1])))  # fmt: skip


def layout_of(tensors: dict[str, np.ndarray] | list[np.ndarray], names=None) -> list:
    if isinstance(tensors, dict):
        return [(k, str(v.dtype), v.shape) for k, v in sorted(tensors.items())]
    return [(n, str(a.dtype), a.shape) for n, a in zip(names, tensors, strict=True)]


def predict(learner: LivefitProcess, rows: np.ndarray) -> np.ndarray:
    response = httpx.post(
        f"{learner.url}/v1/models/demo:predict", json={"instances": rows.tolist()}, timeout=30
    )
    assert response.status_code == 200, response.text
    return np.asarray(response.json()["predictions"], dtype=np.float64)


def test_a_learner_on_two_devices_trains_and_saves_as_one_does(
    broker: Mosquitto, tmp_path: Path
) -> None:
    one_dir, two_dir = tmp_path / "one", tmp_path / "two"
    one = LivefitProcess(learner_text(broker, one_dir, "dev-one", 1), tmp_path, name="one")
    two = LivefitProcess(learner_text(broker, two_dir, "dev-two", 2), tmp_path, name="two")
    learners = [one, two]
    try:
        for learner in learners:
            learner.start()
        assert "trains on /CPU:0, /CPU:1" in two.tail(400)
        published = publish_in_turn(broker, learners)
        time.sleep(0.5)  # nothing trained twice shows up late
        for learner in learners:
            assert learner.metric("livefit_train_samples_total", model="demo") == published
        version = one.metric("livefit_model_version", model="demo")
        assert two.metric("livefit_model_version", model="demo") == version
        one_names, one_weights = served_snapshot(one, version)
        two_names, two_weights = served_snapshot(two, version)
        assert layout_of(one_weights, one_names) == layout_of(two_weights, two_names)
        for a, b in zip(one_weights, two_weights, strict=True):
            np.testing.assert_allclose(a, b, atol=WEIGHTS_ATOL)
    finally:
        stop_all(learners)
    one_checkpoint, two_checkpoint = newest_checkpoint(one_dir), newest_checkpoint(two_dir)
    assert layout_of(one_checkpoint) == layout_of(two_checkpoint)
    for key, value in one_checkpoint.items():
        if key.startswith(("w:", "o:")):
            np.testing.assert_allclose(value, two_checkpoint[key], atol=WEIGHTS_ATOL, err_msg=key)

    # Each one's checkpoint on the other placement: restored exactly, predicting the same.
    shutil.copytree(two_dir, tmp_path / "two-on-one")
    shutil.copytree(one_dir, tmp_path / "one-on-two")
    crossed = [
        LivefitProcess(learner_text(broker, tmp_path / "two-on-one", "dev-x1", 1), tmp_path,
                       name="two-on-one"),
        LivefitProcess(learner_text(broker, tmp_path / "one-on-two", "dev-x2", 2), tmp_path,
                       name="one-on-two"),
    ]  # fmt: skip
    probe = np.random.default_rng(9).normal(size=(5, 4))
    try:
        for learner in crossed:
            learner.start()
        for learner, checkpoint in zip(crossed, (two_checkpoint, one_checkpoint), strict=True):
            assert learner.metric("livefit_model_samples", model="demo") == published
            _, weights = served_snapshot(learner, version)
            stored = [checkpoint[f"w:{i:04d}"] for i in range(len(weights))]
            for a, b in zip(weights, stored, strict=True):
                np.testing.assert_array_equal(a, b)
        on_one, on_two = (predict(learner, probe) for learner in crossed)
        print(
            "largest prediction difference, one device against two:", np.abs(on_one - on_two).max()
        )
        np.testing.assert_allclose(on_one, on_two, atol=WEIGHTS_ATOL * 10)
    finally:
        stop_all(crossed)


def test_a_device_tensorflow_does_not_see_stops_the_start(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[tensorflow]\ndevices = ["CPU:0", "GPU:3"]\n'
        '[models.demo]\nbuilder = "linear"\ninput_shape = [2]\noutput_shape = [1]\n',
    )
    done = subprocess.run(
        [sys.executable, "-m", "livefit", "serve", "--config", str(path), "--workers", "0"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=quiet_env(),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "livefit: tensorflow.devices: /GPU:3 not found; TensorFlow sees /CPU:0 (split the CPU "
        "with tensorflow.logical_cpu_devices to try several devices without GPUs)"
    )
    assert "Traceback" not in done.stderr
