"""Labels, a pin and a rollback through real processes: a one-process ``livefit serve`` with an
admin token on a real mosquitto, moved with ``livefit versions``, and a replica started late.

1. two rounds of samples: versions A and B, each with its predictions when it was newest.
   ``stable`` is pointed at A and the unversioned path pinned to B; a wrong admin token is 401.
   A third round trains on (C): the pin and the label still answer B and A.
2. SIGKILL of the learner, a restart on the same storage: both still apply, A and B answer what
   they answered when each was newest (their weights from the files beside the checkpoints).
3. a replica started after the moves (no admin token: its admin routes are 403) serves A for
   ``stable`` and B unversioned, from the signed record and the held payloads the broker kept.
4. a rollback that trains on from A: the pin is lifted and the new version R predicts what A
   did, on the learner and, once the stream brings it, on the replica.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import numpy as np

from livefit.cli import main
from livefit.local_servers import LivefitProcess
from livefit.server.runtime.local_process import stop_all
from livefit.server.runtime.mosquitto import Mosquitto
from tests.configs import learner_config, model
from tests.disks import fill, mounted_tmpfs
from tests.e2e.test_average_restart import publish
from tests.e2e.test_reliability import wait_trained

ROWS = np.random.default_rng(4).normal(size=(3, 8)).astype(np.float32)
CHUNK = 100  # samples a round
TOKEN = "admin-e2e"


def config(broker: Mosquitto, storage: Path, admin: bool) -> str:
    demo = model(lines="learning_rate = 0.05\nseed = 3", train="max_batch_size = 16",
                 checkpoint="interval_s = 3600")  # fmt: skip
    text = learner_config(broker, storage, f"labels-{broker.port}", demo)
    return text.replace("[http]\n", f'[http]\nadmin_token = "{TOKEN}"\n', 1) if admin else text


def predict(url: str, path: str = "") -> tuple[int, list[list[float]]]:
    """The version and predictions of ``ROWS`` at ``/v1/models/demo<path>:predict``."""
    answer = httpx.post(f"{url}/v1/models/demo{path}:predict",
                        json={"instances": ROWS.tolist()}, timeout=30)  # fmt: skip
    assert answer.status_code == 200, answer.text
    body = answer.json()
    return int(body["model_version"]), body["predictions"]


def newest(server: LivefitProcess, samples: int) -> tuple[int, list[list[float]]]:
    """Once ``samples`` are trained and the last version is served: it and its predictions."""
    wait_trained(server, samples)
    trained = int(server.metric("livefit_model_version", model="demo"))
    deadline = time.monotonic() + 10
    while (found := predict(server.url, "/labels/latest"))[0] != trained:
        assert time.monotonic() < deadline, (found[0], trained)
        time.sleep(0.05)
    return found


def versions(url: str, *args: str) -> None:
    assert main(["versions", *args, "--url", url, "--admin-token", TOKEN]) == 0


def wait_for(url: str, path: str, version: int, timeout: float = 30) -> list[list[float]]:
    """The predictions at ``path`` once ``version`` answers there (a replica catching up)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found, predictions = predict(url, path)
        except AssertionError:  # 503: the named version's weights have not arrived yet
            found, predictions = -1, []
        if found == version:
            return predictions
        assert time.monotonic() < deadline, f"{url}{path} answers {found}, not {version}"
        time.sleep(0.1)


def test_labels_and_pins_survive_a_sigkill_reach_a_late_replica_and_roll_back(
    own_broker: Mosquitto, tmp_path: Path
) -> None:
    storage = tmp_path / "data"
    learner = LivefitProcess(config(own_broker, storage, admin=True), tmp_path, name="a").start()
    replica: LivefitProcess | None = None
    try:
        publish(own_broker, CHUNK, "round-1", seed=1)
        a, when_a = newest(learner, CHUNK)
        publish(own_broker, CHUNK, "round-2", seed=2)
        b, when_b = newest(learner, 2 * CHUNK)
        assert a < b and when_a != when_b
        versions(learner.url, "label", "demo", "stable", str(a))
        versions(learner.url, "pin", "demo", str(b))
        wrong = {"Authorization": "Bearer not-the-token"}
        refused = httpx.put(f"{learner.url}/v1/admin/models/demo/pin", json={}, headers=wrong)
        assert refused.status_code == 401, refused.text
        publish(own_broker, CHUNK, "round-3", seed=3)
        c, _ = newest(learner, 3 * CHUNK)
        assert c > b
        assert predict(learner.url) == (b, when_b)
        assert predict(learner.url, "/labels/stable") == (a, when_a)

        learner.stop(signal.SIGKILL, timeout=10)
        learner = LivefitProcess(learner.config, tmp_path, name="b").start(ready_timeout_s=None)
        replica = LivefitProcess(  # started after the moves; beside the restart, to save time
            config(own_broker, storage, admin=False), tmp_path, "replica", name="replica"
        ).start(ready_timeout_s=None)
        learner.wait_ready(120)
        assert predict(learner.url) == (b, when_b)  # the restored pin, from the held file
        assert predict(learner.url, "/labels/stable") == (a, when_a)

        replica.wait_ready(120)
        assert wait_for(replica.url, "/labels/stable", a) == when_a
        assert wait_for(replica.url, "", b) == when_b
        off = httpx.put(f"{replica.url}/v1/admin/models/demo/pin", json={},
                        headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
        assert off.status_code == 403 and "http.admin_token" in off.text

        versions(learner.url, "rollback", "demo", str(a), "--mode", "train")
        rolled, when_rolled = predict(learner.url)  # the pin is lifted: the newest, R
        assert rolled > c
        np.testing.assert_allclose(when_rolled, when_a, rtol=1e-6)
        assert predict(learner.url, f"/versions/{rolled}") == (rolled, when_rolled)
        np.testing.assert_allclose(wait_for(replica.url, "", rolled), when_a, rtol=1e-6)
    finally:
        stop_all([p for p in (replica, learner) if p is not None])


def test_a_move_on_a_full_disk_is_a_503_and_changes_nothing(
    own_broker: Mosquitto, tmp_path: Path
) -> None:
    """The serving record lives beside the checkpoints: on a full disk a move cannot be made
    durable, so it is refused (503, naming the directory) and serving, the record on disk and
    the replicas keep the record before; once there is room the same move succeeds."""
    with mounted_tmpfs(tmp_path / "disk", "8m") as disk:
        learner = LivefitProcess(config(own_broker, disk / "data", admin=True), tmp_path).start()
        try:
            publish(own_broker, CHUNK, "round-1", seed=1)
            a, when_a = newest(learner, CHUNK)
            versions(learner.url, "label", "demo", "stable", str(a))
            record = next((disk / "data").rglob("serving.json"))
            before = record.read_bytes()
            filler = fill(disk)
            auth = {"Authorization": f"Bearer {TOKEN}"}
            admin = f"{learner.url}/v1/admin/models/demo"
            for method, path, body in (("PUT", "/pin", {"version": a}),
                                       ("PUT", "/labels/canary", {"version": a}),
                                       ("DELETE", "/labels/stable", None)):  # fmt: skip
                refused = httpx.request(method, admin + path, json=body, headers=auth, timeout=30)
                assert refused.status_code == 503, refused.text
                assert "could not be written" in refused.text, refused.text
            assert record.read_bytes() == before
            state = httpx.get(f"{admin}/versions", headers=auth, timeout=30).json()["record"]
            assert state["pinned"] is None and set(state["labels"]) == {"stable"}
            assert predict(learner.url) == (a, when_a)
            filler.unlink()
            moved = httpx.put(f"{admin}/pin", json={"version": a}, headers=auth, timeout=30)
            assert moved.status_code == 200, moved.text
            state = httpx.get(f"{admin}/versions", headers=auth, timeout=30).json()["record"]
            assert state["pinned"] == a and record.read_bytes() != before
        finally:
            learner.stop()
