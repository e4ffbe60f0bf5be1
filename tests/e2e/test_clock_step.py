"""A wall-clock step under a running learner (issue 45 item 5): stepping its clock +1 h for 8 s
expired every pending prediction at once, and a replica read ``livefit_weights_age_seconds``
-3,600 for the snapshots made meanwhile.

The learner runs under libfaketime (Debian's ``faketime`` package; ``./dev test`` installs
it): ``FAKETIME_TIMESTAMP_FILE`` is an offset the test rewrites while the learner runs, and
``FAKETIME_DONT_FAKE_MONOTONIC`` leaves the monotonic clock alone, as an NTP step or an
operator's ``date -s`` does. The machine's clock is never touched.
"""

from __future__ import annotations

import glob
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from livefit.clients.payloads import encode_samples
from livefit.clients.predict import PredictClient
from livefit.local_servers import LivefitProcess
from livefit.server.runtime.local_process import quiet_env, stop_all
from livefit.server.runtime.mosquitto import Mosquitto
from tests import configs
from tests.e2e.test_labels_e2e import outcome, publish, wait_for
from tests.layouts import metric

STEP_S = 3600
LIBFAKETIME = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
# libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC fails clock_nanosleep(TIMER_ABSTIME),
# which Python's time.sleep uses: the stepped process sleeps by select instead.
SITECUSTOMIZE = """import select, time


def _sleep(seconds):
    select.select([], [], [], seconds)


time.sleep = _sleep
"""

pytestmark = pytest.mark.skipif(not LIBFAKETIME, reason="libfaketime (apt: faketime) missing")


def stepped_env(workdir: Path, offset: Path) -> dict[str, str]:
    """The learner's environment: libfaketime following ``offset`` (re-read every second)."""
    site = workdir / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    offset.write_text("+0\n")
    return quiet_env(
        LD_PRELOAD=LIBFAKETIME[0], FAKETIME_TIMESTAMP_FILE=str(offset),
        FAKETIME_CACHE_DURATION="1", FAKETIME_DONT_FAKE_MONOTONIC="1", PYTHONPATH=str(site),
    )  # fmt: skip


Fleet = tuple[Mosquitto, LivefitProcess, LivefitProcess, Path]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    broker = Mosquitto(tmp_path / "mosquitto")
    broker.start()
    text = configs.learner_config(
        broker, tmp_path / "data", f"clock-{broker.port}",
        configs.model("clock", input_shape=[2], lines="seed = 3",
                      weights="publish_interval_s = 0.2", labels="tick_s = 0.2\nttl_s = 600"),
    )  # fmt: skip
    offset = tmp_path / "offset"
    learner = LivefitProcess(text, tmp_path, env=stepped_env(tmp_path, offset))
    replica = LivefitProcess(text, tmp_path, command="replica")
    try:
        learner.start(ready_timeout_s=None)
        replica.start(ready_timeout_s=None)
        learner.wait_ready()
        replica.wait_ready()
        yield broker, learner, replica, offset
    finally:
        stop_all([learner, replica])
        broker.stop()


def samples(n: int) -> bytes:
    x = np.random.default_rng(1).uniform(-1, 1, (n, 2)).astype(np.float32)
    return encode_samples(x, x.sum(axis=1, keepdims=True), fmt="msgpack", batched=True)


def test_a_wall_clock_step_expires_nothing_and_ages_stay_positive(fleet) -> None:
    broker, learner, replica, offset = fleet
    ids = [f"c{i}" for i in range(20)]
    pending = lambda: metric(learner, "livefit_pending_predictions", model="clock")  # noqa: E731
    with PredictClient(learner.url) as client:
        client.predict("clock", [[0.5, -1.0]] * 20, ids=ids)
    assert wait_for(pending, 20) == 20
    version = replica.metric("livefit_serving_version", model="clock")
    offset.write_text(f"+{STEP_S}\n")
    stepped_at = time.monotonic()
    try:
        time.sleep(2.0)  # libfaketime re-reads the offset within a second; ticks every 0.2 s
        publish(broker, "livefit/clock/samples", [samples(40)])  # a snapshot made stepped
        replica.wait_for_metric("livefit_serving_version", version + 1, model="clock")
        served_stepped = replica.metric("livefit_serving_version", model="clock") > version
        age = replica.metric("livefit_weights_age_seconds", model="clock")
        ahead = replica.metric("livefit_clock_ahead_total", model="clock", source="snapshot")
        time.sleep(max(0.0, 8.0 - (time.monotonic() - stepped_at)))
        expired, still = outcome(learner, "clock", "expired"), pending()
    finally:
        offset.write_text("+0\n")
    figures = f"expired {expired}, pending {still}, replica weights age {age:.0f} s"
    assert (expired, still) == (0, 20), figures
    assert served_stepped, figures
    assert age >= 0 and ahead >= 1, figures
    time.sleep(1.5)
    with PredictClient(learner.url) as client:
        client.labels("clock", ids, [[1.0]] * 20)
    assert wait_for(lambda: outcome(learner, "clock", "joined"), 20) == 20, figures
    assert outcome(learner, "clock", "late") == 0
    print(figures)
