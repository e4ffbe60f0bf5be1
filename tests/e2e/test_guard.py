"""The guard through real processes: a one-process ``livefit serve`` on its own mosquitto, with
``[models.demo.guard]`` on a reference set of clean samples. Clean samples train it; then a
label-flipping publisher (targets negated) poisons the stream: within a bounded number of
poisoned samples the guard holds a pre-poison version (``livefit_guard_held_version``, the
unversioned answer's version), which still answers clean inputs well while the newest does not.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import numpy as np

from livefit.clients.publisher import SamplePublisher
from livefit.clients.synthetic import LinearStream
from livefit.local_servers import LivefitProcess
from livefit.server.runtime.local_process import stop_all
from livefit.server.runtime.mosquitto import Mosquitto
from tests.configs import learner_config, model

SEED = 7  # fixes the linear function every stream here draws from
CLEAN = 600  # clean samples trained before the poison
POISON_STEP = 20  # poisoned samples published between two looks
POISON_MAX = 200  # the hold must show within this many poisoned samples


def clean_rows(n: int, skip: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` noiseless samples of the stream's function, drawn after ``skip`` others."""
    stream = LinearStream(8, noise=0.0, seed=SEED)
    stream.sample(skip)
    return stream.sample(n)


def send(broker: Mosquitto, x: np.ndarray, y: np.ndarray, source: str) -> None:
    with SamplePublisher(
        broker.url, "livefit/demo/samples", fmt="msgpack", source=source, ack_timeout_s=60
    ) as publisher:
        assert publisher.publish_stream(iter([(x, y)]), batch=10).samples == len(x)


def trained(server: LivefitProcess, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while server.metric("livefit_model_samples", model="demo") < count:
        assert time.monotonic() < deadline, f"{count} samples not trained"
        time.sleep(0.05)


def answer(url: str, rows: np.ndarray, path: str = "") -> tuple[int, np.ndarray]:
    body = httpx.post(f"{url}/v1/models/demo{path}:predict",
                      json={"instances": rows.tolist()}, timeout=30).json()  # fmt: skip
    return int(body["model_version"]), np.asarray(body["predictions"], np.float32)


def test_the_guard_holds_a_pre_poison_version_against_a_label_flipping_publisher(
    own_broker: Mosquitto, tmp_path: Path
) -> None:
    ref_x, ref_y = clean_rows(200, skip=10_000)  # never published
    reference = tmp_path / "reference.csv"
    np.savetxt(reference, np.hstack([ref_x, ref_y]), delimiter=",", fmt="%.6f")
    probe_x, probe_y = clean_rows(50, skip=20_000)
    demo = model(lines="learning_rate = 0.05\nseed = 3", train="max_batch_size = 16",
                 checkpoint="interval_s = 3600",
                 guard=f'enabled = true\nreference_path = "{reference}"\nmargin = 2.0')  # fmt: skip
    text = learner_config(own_broker, tmp_path / "data", f"guard-{own_broker.port}", demo)
    server = LivefitProcess(text, tmp_path).start()
    try:
        stream = LinearStream(8, noise=0.05, seed=SEED)
        x, y = stream.sample(CLEAN)
        send(own_broker, x, y, "clean")
        trained(server, CLEAN)
        before = server.metric("livefit_model_version", model="demo")  # the last clean one
        deadline = time.monotonic() + 10
        while (found := answer(server.url, probe_x))[0] != before:  # serving swaps it in
            assert time.monotonic() < deadline, (found[0], before)
            time.sleep(0.05)
        good = found[1]
        assert float(np.mean((good - probe_y) ** 2)) < 0.05
        assert server.metric("livefit_guard_held_version", model="demo") == -1

        poisoned = 0
        held = -1.0
        while held < 0:
            assert poisoned < POISON_MAX, f"no hold after {poisoned} poisoned samples"
            x, y = stream.sample(POISON_STEP)
            send(own_broker, x, -y, f"flip-{poisoned}")  # the labels flipped
            poisoned += POISON_STEP
            trained(server, CLEAN + poisoned)
            held = server.metric("livefit_guard_held_version", model="demo")
        x, y = stream.sample(200)  # the poison goes on: the hold stays
        send(own_broker, x, -y, "flip-more")
        trained(server, CLEAN + poisoned + 200)
        time.sleep(0.5)  # the guard scores the last snapshot on its own thread

        held = server.metric("livefit_guard_held_version", model="demo")
        newest = server.metric("livefit_model_version", model="demo")
        assert 0 <= held <= before < newest, (held, before, newest)
        served, predictions = answer(server.url, probe_x)
        assert served == held
        assert float(np.mean((predictions - probe_y) ** 2)) < 0.05
        _, latest = answer(server.url, probe_x, "/labels/latest")
        assert float(np.mean((latest - probe_y) ** 2)) > 0.5  # the newest learned the poison
        assert server.metric("livefit_guard_holds_total", model="demo") >= 1
    finally:
        stop_all([server])
