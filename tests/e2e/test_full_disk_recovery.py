"""A full disk under a running learner, then a crash or a graceful stop (issue 45, items 1, 2).

Through a real mosquitto and a real ``livefit serve`` on a small tmpfs (root only; skipped
elsewhere), with a subscriber on the weight topic recording the version of every snapshot:

- a crash: samples acknowledged, the disk filled while the trainer still has thousands of them
  queued, so its versions pass the block claimed in the version mark on disk; SIGKILL, the disk
  freed, a restart on the same storage. No version published after the restart was published
  before it: every one is above every one published before, so a replica never refuses one
  as ``stale``. Before: the trainer published far past its mark, and the restart published
  those numbers again with other weights;
- a graceful stop: samples ingested onto a disk with room for the log and not for a checkpoint,
  then the disk freed. Readiness comes back within seconds, a SIGTERM leaves the checkpoint
  of the final version on disk and the restart replays nothing. Before: readiness stayed 503
  (nothing retried a checkpoint at an unchanged version), the stop wrote none, and the restart
  replayed everything since the last good one.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from livefit.local_servers import LivefitProcess
from livefit.server.runtime.mosquitto import Mosquitto
from livefit.server.storage.checkpoint import CheckpointStore
from livefit.server.weights.format import WeightsRejected, open_envelope
from tests import configs
from tests.configs import model
from tests.disks import fill, mounted_tmpfs
from tests.e2e.test_hardening import publish_samples, ready, trained, wait_trained
from tests.layouts import ONE_PROCESS, metric

WEIGHTS_TOPIC = "livefit/demo/weights"
TOTAL = 11_000  # samples of the crash test: 1,000 trained, then 10,000 queued when the disk fills
# A network whose checkpoint (weights, optimizer moments, average: about 270 KB) is far larger
# than the write-ahead log of a few thousand 4-input samples, and whose steps of 4 samples keep
# the trainer seconds behind a publisher
NETWORK = "builder_options = { hidden_units = [128, 128] }\nseed = 3"


def learner_config(
    broker: Mosquitto, storage: Path, client_id: str, layout: str = ONE_PROCESS
) -> str:
    demo = model(
        builder="mlp", input_shape=[4], lines=NETWORK, train="max_batch_size = 4",
        weights="publish_interval_s = 0.1", checkpoint="interval_s = 1.0",
    )  # fmt: skip
    return configs.learner_config(broker, storage, client_id, demo, layout=layout)


class VersionRecorder:
    """The (lineage, version) of every snapshot seen on the weight topic, in order."""

    def __init__(self, broker: Mosquitto) -> None:
        self.seen: list[tuple[str, int]] = []
        self._lock = threading.Lock()
        self._client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self._client.on_message = self._on_message
        self._client.connect("127.0.0.1", broker.port)
        self._client.subscribe(WEIGHTS_TOPIC, qos=1)
        self._client.loop_start()

    def _on_message(self, client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
        try:
            header = open_envelope(message.payload).header
        except WeightsRejected:
            return
        with self._lock:
            self.seen.append((header.lineage, header.version))

    def mark(self) -> int:
        """How many have been seen so far (``since`` takes the rest)."""
        with self._lock:
            return len(self.seen)

    def since(self, start: int) -> list[tuple[str, int]]:
        with self._lock:
            return self.seen[start:]

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def version_mark(storage: Path) -> int:
    """The version high-water mark on disk (0: none written yet)."""
    mark = storage / "checkpoints" / "demo" / "version-high-water-mark"
    return int(mark.read_text()) if mark.exists() else 0


def wait_until(
    condition: Callable[[], bool], timeout: float, interval: float = 0.1
) -> float | None:
    """Seconds until ``condition()`` held, or None when it did not within ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(interval)
    return None


def test_a_crash_after_a_full_disk_hands_out_no_version_twice(
    own_broker: Mosquitto, tmp_path: Path
) -> None:
    with mounted_tmpfs(tmp_path / "disk", "8m") as disk:
        storage = disk / "data"
        text = learner_config(own_broker, storage, f"versions-{own_broker.port}")
        recorder = VersionRecorder(own_broker)
        server = LivefitProcess(text, tmp_path).start()
        try:
            publish_samples(own_broker, 1_000, batch=100)
            assert wait_trained(server, 1_000) == 1_000  # versions claimed on disk
            publish_samples(own_broker, TOTAL - 1_000, batch=100, source="backlog")
            accepted = server.wait_for_metric("livefit_ingest_samples_total", TOTAL, model="demo")
            assert accepted == TOTAL  # all in the log and acknowledged
            behind = TOTAL - trained(server)
            filler = fill(disk)
            mark = version_mark(storage)
            assert wait_trained(server, TOTAL, timeout=180) == TOTAL  # training went on
            version = metric(server, "livefit_model_version", model="demo")
            problems = ready(server).json().get("problems", [])
            time.sleep(1.0)  # what is held stays held
            before = recorder.since(0)
            assert server.stop(signal.SIGKILL) == -signal.SIGKILL
            filler.unlink()
            mark_at_crash = version_mark(storage)
            start = recorder.mark()
            server = LivefitProcess(text, tmp_path).start()
            # the log replayed; a message the checkpoint had half trained is trained again
            assert TOTAL <= wait_trained(server, TOTAL, timeout=120) <= TOTAL + 100
            version_after = metric(server, "livefit_model_version", model="demo")
            wait_until(lambda: any(v >= version_after for _, v in recorder.since(start)), 30)
            after = recorder.since(start)
        finally:
            recorder.close()
            server.stop()
    lineages = {lineage for lineage, _ in before + after}
    published = [v for _, v in before]
    print(f"full disk at {behind:.0f} samples behind, mark {mark} (at the crash {mark_at_crash}),"
          f" trained to v{version:.0f}; published before the crash: {len(published)} snapshots "
          f"up to v{max(published)}; after: {len(after)} from v{min(v for _, v in after)} to "
          f"v{max(v for _, v in after)}; readiness problems {problems}")  # fmt: skip
    assert version > mark, "the trainer never passed its claimed versions: nothing was attacked"
    assert any("version_mark" in p for p in problems), problems
    assert len(lineages) == 1  # one history: its versions must never repeat
    reused = sorted({v for _, v in after} & set(published))
    assert not reused, f"{len(reused)} versions published again: {reused[:5]}..."
    assert min(v for _, v in after) > max(published)  # so no replica refuses one as stale
    assert max(published) <= mark_at_crash  # nothing left beyond what the disk records


def test_storage_that_works_again_is_noticed_and_a_stop_writes_its_checkpoint(
    own_broker: Mosquitto, tmp_path: Path
) -> None:
    """One process: the retried checkpoint and the one a stop writes are the trainer's, the
    same in both layouts. What the split layout adds is proved elsewhere: its readiness 503 on
    the training process's storage problem and 200 once the disk is freed
    (``test_hardening.py::test_full_disk_loses_no_acknowledged_sample[split]``), and a SIGTERM
    that checkpoints what was trained, then a restart that replays nothing
    (``test_learner_group.py::test_sigterm_trains_what_was_accepted_then_stops_serving``)."""
    with mounted_tmpfs(tmp_path / "disk", "6m") as disk:
        storage = disk / "data"
        text = learner_config(own_broker, storage, f"recovery-{own_broker.port}")
        server = LivefitProcess(text, tmp_path).start()
        try:
            publish_samples(own_broker, 1_000, batch=100)
            assert wait_trained(server, 1_000) == 1_000
            assert server.wait_for_metric(
                "livefit_checkpoints_total", 1, model="demo", outcome="ok"
            ) >= 1  # fmt: skip
            # Room for the log of what comes next, not for a checkpoint
            filler = fill(disk, leave=160_000)
            publish_samples(own_broker, 2_000, batch=100, source="after-fill")
            assert wait_trained(server, 3_000) == 3_000
            failing = wait_until(lambda: ready(server).status_code == 503, 30)
            problems = ready(server).json().get("problems", [])
            time.sleep(2.0)  # the trainer is idle: its version stands still
            filler.unlink()
            recovered = wait_until(
                lambda: ready(server).status_code == 200
                and server.metric("livefit_storage_healthy") == 1,
                timeout=30,
            )  # fmt: skip
            version = metric(server, "livefit_model_version", model="demo")
            stopped = server.stop()
            newest = CheckpointStore(storage / "checkpoints" / "demo", "demo").load_latest()
            server = LivefitProcess(text, tmp_path).start()
            total = wait_trained(server, 3_000, timeout=60)
            time.sleep(1.0)
            replayed = metric(server, "livefit_wal_replayed_samples_total", model="demo")
        finally:
            server.stop()
    checkpointed = newest.version if newest is not None else None
    print(f"readiness 503 after {failing} s ({problems}); 200 again {recovered} s after the "
          f"disk was freed; stopped at v{version:.0f} with exit {stopped}, newest checkpoint "
          f"v{checkpointed}; the restart replayed {replayed:.0f} samples, {total:.0f} in the "
          "lineage")  # fmt: skip
    assert failing is not None and any("checkpoint" in p for p in problems), problems
    assert recovered is not None, "readiness still 503 30 s after the disk was freed"
    assert stopped == 0
    assert checkpointed == version  # the final version's checkpoint is on disk
    assert total == 3_000 and replayed == 0
