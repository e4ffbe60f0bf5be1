"""The guard through real processes: a one-process ``livefit serve`` on its own mosquitto.

- With ``[models.demo.guard]`` on a reference set of clean samples: clean samples train it; then
  a label-flipping publisher (targets negated) poisons the stream: within a bounded number of
  poisoned samples the guard holds a pre-poison version (``livefit_guard_held_version``, the
  unversioned answer's version), which still answers clean inputs well while the newest does not.
- Without a reference set (the shadow side, default margin): clean training and a real drift
  (the function changes for good) are never held beyond a brief hold at the noise floor, which
  a step's jitter can cause (documented); one message from a broken sensor (inputs 1,000x)
  ruins the newest, and the guard holds the version from before it within a bounded number of
  clean samples.
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
NOISE = 0.05  # the label noise of the published stream
CLEAN = 600  # clean samples trained before the poison
POISON_STEP = 20  # poisoned samples published between two looks
POISON_MAX = 200  # the hold must show within this many poisoned samples
SHADOW_MAX = 1_000  # no reference set: held within this many clean samples (about 4 windows)
DRIFTED = 1_500  # samples of the new function after a drift
BRIEF_HOLD = 1_024  # a brief hold at the noise floor ends within four windows (window = 256)


def clean_rows(n: int, skip: int, noise: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples of the stream's function (noiseless unless told), drawn after ``skip``
    others."""
    stream = LinearStream(8, noise=noise, seed=SEED)
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


def mse(predictions: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean((predictions - y) ** 2))


def served_and_newest(url: str, x: np.ndarray, y: np.ndarray) -> tuple[int, float, float]:
    """The unversioned answer's version and MSE on ``x``, and the newest version's MSE
    (``/labels/latest``: what serving would answer without the guard)."""
    served, predictions = answer(url, x)
    _, latest = answer(url, x, "/labels/latest")
    return served, mse(predictions, y), mse(latest, y)


def test_the_guard_holds_a_pre_poison_version_against_a_label_flipping_publisher(
    own_broker: Mosquitto, tmp_path: Path
) -> None:
    # never published; with the stream's label noise, as an operator's set has: on noiseless
    # labels two clean versions' tiny losses can differ by more than the margin
    ref_x, ref_y = clean_rows(200, skip=10_000, noise=NOISE)
    reference = tmp_path / "reference.csv"
    np.savetxt(reference, np.hstack([ref_x, ref_y]), delimiter=",", fmt="%.6f")
    probe_x, probe_y = clean_rows(50, skip=20_000)
    demo = model(lines="learning_rate = 0.05\nseed = 3", train="max_batch_size = 16",
                 checkpoint="interval_s = 3600",
                 guard=f'enabled = true\nreference_path = "{reference}"\nmargin = 2.0')  # fmt: skip
    text = learner_config(own_broker, tmp_path / "data", f"guard-{own_broker.port}", demo)
    server = LivefitProcess(text, tmp_path).start()
    try:
        stream = LinearStream(8, noise=NOISE, seed=SEED)
        x, y = stream.sample(CLEAN)
        send(own_broker, x, y, "clean")
        trained(server, CLEAN)
        before = server.metric("livefit_model_version", model="demo")  # the last clean one
        deadline = time.monotonic() + 10
        while (found := answer(server.url, probe_x))[0] != before:  # serving swaps it in
            assert time.monotonic() < deadline, (found[0], before)
            time.sleep(0.05)
        good = found[1]
        assert mse(good, probe_y) < 0.05
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
        served, held_mse, latest_mse = served_and_newest(server.url, probe_x, probe_y)
        print(f"held v{held:.0f} after {poisoned} poisoned samples; MSE on clean inputs: before "
              f"{mse(good, probe_y):.4f}, served with the guard {held_mse:.4f}, "
              f"the newest (without it) {latest_mse:.4f}")  # fmt: skip
        assert served == held
        assert held_mse < 0.05
        assert latest_mse > 0.5  # the newest learned the poison
        assert server.metric("livefit_guard_holds_total", model="demo") >= 1
    finally:
        stop_all([server])


def answer_once_newest_served(
    server: LivefitProcess, x: np.ndarray
) -> tuple[int, float, np.ndarray]:
    """The version that answered ``x``, the trainer's newest and the answer, once serving has
    swapped the newest in (it swaps between batches: under load it may lag a second)."""
    deadline = time.monotonic() + 5
    while True:
        newest = server.metric("livefit_model_version", model="demo")
        served, answered = answer(server.url, x)
        if served == newest or time.monotonic() > deadline:
            return served, newest, answered
        time.sleep(0.1)


def held(server: LivefitProcess) -> float:
    return server.metric("livefit_guard_held_version", model="demo")


def shadow_server(broker: Mosquitto, tmp_path: Path) -> LivefitProcess:
    """A learner with the guard on and no reference set, the other settings as a user's."""
    demo = model(lines="seed = 3", checkpoint="interval_s = 3600", guard="enabled = true")
    text = learner_config(broker, tmp_path / "data", f"shadow-{broker.port}", demo)
    return LivefitProcess(text, tmp_path).start()


def clean_stream(broker: Mosquitto, server: LivefitProcess, stream: LinearStream, start: int,
                 n: int, step: int = 50) -> int:  # fmt: skip
    """Publish ``n`` samples of ``stream`` as a steady stream (many small batches); the count
    trained after them."""
    for sent in range(start, start + n, step):
        x, y = stream.sample(step)
        send(broker, x, y, f"clean-{sent}")
        trained(server, sent + step)
    return start + n


def test_without_a_reference_set_a_drift_is_followed_and_a_broken_sensor_held(
    own_broker: Mosquitto, tmp_path: Path
) -> None:
    """Clean training and then a real drift (the function changes for good: old and newest
    versions both wrong on the new samples, the newest learning them first) are not held, but
    for a brief hold at the noise floor that ends within a few windows. Then one
    message in the wrong units (inputs 1,000x) moves the input statistics for good: the newest
    answers clean inputs worse from then on, and the guard holds the version before it."""
    server = shadow_server(own_broker, tmp_path)
    try:
        sent = clean_stream(own_broker, server, LinearStream(8, noise=NOISE, seed=SEED), 0, CLEAN)
        stream = LinearStream(8, noise=NOISE, seed=SEED + 1)  # another function, for good
        sent = clean_stream(own_broker, server, stream, sent, DRIFTED)
        time.sleep(0.3)  # the guard scores on its own thread
        # At the noise floor a step's jitter can make the newest worse for a window, and a brief
        # hold is documented (docs/operations.md, "The guard"); held through the drift is not.
        followed_at = sent
        while held(server) >= 0:
            assert sent < followed_at + BRIEF_HOLD, f"still held {sent - followed_at} samples on"
            sent = clean_stream(own_broker, server, stream, sent, 50)
            time.sleep(0.1)
        probe_x, probe_y = stream.sample(50)
        served, before, good = answer_once_newest_served(server, probe_x)
        good_mse = mse(good, probe_y)
        assert served == before and good_mse < 0.05  # serving followed the drift

        x, y = stream.sample(10)
        send(own_broker, x * 1000, y, "broken-sensor")
        sent += 10
        broken_at = sent
        while held(server) < 0:
            assert sent < broken_at + SHADOW_MAX, f"no hold after {sent - broken_at} samples"
            sent = clean_stream(own_broker, server, stream, sent, 50)
            time.sleep(0.1)
        assert 0 <= held(server) <= before, (held(server), before)
        to_hold = sent - broken_at
        sent = clean_stream(own_broker, server, stream, sent, 200)  # the hold stays
        time.sleep(0.2)
        served, held_mse, latest_mse = served_and_newest(server.url, probe_x, probe_y)
        print(f"broken sensor: held v{held(server):.0f} (newest before it v{before:.0f}) within "
              f"{to_hold} clean samples; MSE on clean inputs: before {good_mse:.4f}, "
              f"served {held_mse:.4f}, the newest {latest_mse:.4f}")  # fmt: skip
        assert served == held(server) <= before
        assert held_mse < latest_mse and held_mse < 4 * good_mse + 1e-3, (
            held_mse, latest_mse, good_mse,
        )  # fmt: skip
        assert server.metric("livefit_guard_held_samples_total", model="demo") > 0
    finally:
        stop_all([server])
