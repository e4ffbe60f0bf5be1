"""Broker failover through real processes: a 3-node NATS cluster (JetStream, MQTT 3.1.1,
``stream_replicas: 3``), a learner and a replica configured with all three nodes, and a sample
publisher streaming QoS 1 through the cluster, failing over itself. The node the learner is
connected to (``livefit_broker_node_connections``) is SIGKILLed mid-stream: every
acknowledged sample is still trained, training resumes (the seconds from the kill to the
first sample trained beyond what the learner had ingested 0.3 s after it are printed), the replica answers
every prediction through the kill and then serves the learner's newest weights, and the
switch is in the learner's log and ``livefit_broker_failovers_total``.

On the code before failover (one address per client) the learner stays disconnected after the
kill: ``resume_s`` never comes and the test fails at its 60 s bound.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from livefit.clients.publish_results import PublishStats
from livefit.clients.publisher import SamplePublisher
from livefit.clients.synthetic import LinearStream, stream_chunks
from livefit.local_servers import LivefitProcess
from tests.configs import learner_config, model
from tests.nats_cluster import NatsCluster, find_nats_server

pytestmark = pytest.mark.skipif(find_nats_server() is None, reason="nats-server not installed")

COUNT = 4000  # samples published
RATE = 400.0  # samples/s
MESSAGE_SAMPLES = 10
KILL_AT = 1500  # samples trained before the learner's node is killed
RESUME_BOUND_S = 60.0  # generous: the measured figure is printed
SETTLE_S = 0.3


class StreamingPublisher(threading.Thread):
    """Publishes ``COUNT`` samples over every node of the cluster, then waits for each PUBACK."""

    def __init__(self, url: str) -> None:
        super().__init__(name="failover-publisher")
        self.url = url
        self.stats: PublishStats | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            chunks = stream_chunks(LinearStream(input_dim=8, seed=3), COUNT, 1000)
            with SamplePublisher(
                self.url, "livefit/demo/samples", source="failover", protocol="3.1.1",
                client_id="failover-publisher", ack_timeout_s=120,
            ) as publisher:  # fmt: skip
                self.stats = publisher.publish_stream(chunks, batch=MESSAGE_SAMPLES, rate=RATE)
        except BaseException as exc:
            self.error = exc


class Predictions(threading.Thread):
    """Asks the replica for a prediction every 50 ms until stopped; counts what failed."""

    def __init__(self, url: str) -> None:
        super().__init__(name="failover-predictions")
        self.url = f"{url}/v1/models/demo:predict"
        self.stop_event = threading.Event()
        self.answered = 0
        self.failed: list[str] = []

    def run(self) -> None:
        body = {"instances": np.zeros((1, 8)).tolist()}
        with httpx.Client(timeout=10.0) as client:
            while not self.stop_event.wait(0.05):
                try:
                    response = client.post(self.url, json=body)
                    if response.status_code == 200:
                        self.answered += 1
                    else:
                        self.failed.append(f"{response.status_code} {response.text[:200]}")
                except httpx.HTTPError as exc:
                    self.failed.append(repr(exc))


def connected_node(server: LivefitProcess) -> str | None:
    """The broker node (``host:port``) the learner's sample session is connected to."""
    for (name, labels), value in server.metrics().items():
        if name == "livefit_broker_node_connections" and value >= 1:
            return dict(labels)["node"]
    return None


def wait_until(check: object, timeout_s: float, step_s: float = 0.05) -> float | None:
    """Seconds until ``check()`` is true, or None after ``timeout_s``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if check():  # type: ignore[operator]
            return time.monotonic() - start
        time.sleep(step_s)
    return None


def test_learner_replica_and_publisher_fail_over_when_the_node_is_killed(
    tmp_path: Path,
) -> None:
    with NatsCluster(tmp_path / "nats") as cluster:
        comma_separated = ",".join(cluster.urls)
        demo = model(
            lines="learning_rate = 0.01\ndedup = true", train="max_batch_size = 64",
            weights="publish_interval_s = 0.2",
        )  # fmt: skip
        text = learner_config(
            comma_separated, tmp_path / "data", "failover", demo, broker_lines='protocol = "3.1.1"'
        )
        # The learner reads the nodes as a TOML list, the replica as one comma-separated string.
        listed = text.replace(f'url = "{comma_separated}"', f"url = {json.dumps(cluster.urls)}")
        learner = LivefitProcess(listed, tmp_path, name="learner").start()
        replica = LivefitProcess(text, tmp_path, command="replica", name="replica")
        publisher = StreamingPublisher(comma_separated)
        predictions: Predictions | None = None
        try:
            replica.start()
            predictions = Predictions(replica.url)
            predictions.start()
            publisher.start()
            samples = lambda: learner.metric("livefit_model_samples", model="demo")  # noqa: E731
            assert wait_until(lambda: samples() >= KILL_AT, 120, 0.1) is not None, samples()
            node = connected_node(learner)
            assert node is not None, "the learner names no connected node"
            failovers_before = learner.metric("livefit_broker_failovers_total")
            killed = cluster.node(node)
            assert killed.stop(signal.SIGKILL) == -signal.SIGKILL
            killed_at = time.monotonic()
            # What the killed node delivered is ingested within milliseconds; a sample trained
            # beyond what was ingested SETTLE_S after the kill came through another node.
            time.sleep(SETTLE_S)
            ingested = learner.metric("livefit_ingest_samples_total", model="demo")
            wait_until(lambda: samples() > ingested, RESUME_BOUND_S)
            resume_s = time.monotonic() - killed_at if samples() > ingested else None
            assert resume_s is not None, f"training did not resume within {RESUME_BOUND_S:.0f} s"
            print(
                f"killed {node} at {ingested:.0f} samples ingested; resumed after {resume_s:.2f} s"
            )
            after = connected_node(learner)
            publisher.join(240)
            assert publisher.error is None, publisher.error
            assert publisher.stats is not None and publisher.stats.samples == COUNT
            # Every sample was acknowledged to the publisher: each must be trained.
            wait_until(lambda: samples() >= COUNT, 120, 0.2)
            time.sleep(2.0)  # a quiet period: duplicates, if any, show up too
            trained = samples()
            versions = learner.metric("livefit_model_version", model="demo")
            followed_s = wait_until(
                lambda: replica.metric("livefit_serving_version", model="demo") >= versions, 60
            )
            failovers = learner.metric("livefit_broker_failovers_total") - failovers_before
        finally:
            if predictions is not None:
                predictions.stop_event.set()
                predictions.join(30)
            publisher.join(240)
            replica.stop()
            learner.stop()
    log = (tmp_path / "learner.log").read_text()
    replica_log = (tmp_path / "replica.log").read_text()
    print(
        f"on {after} after the kill; {trained:.0f} of {COUNT} trained; {failovers:.0f} "
        f"failovers; replica at v{versions:.0f} after {followed_s} s, "
        f"{predictions.answered if predictions else 0} predictions answered"
    )
    assert after is not None and after != node, (node, after)
    assert trained >= COUNT, f"acknowledged samples lost: {trained:.0f} of {COUNT} trained"
    assert failovers >= 1
    assert f"fails over from broker node {node}" in log
    assert predictions is not None and not predictions.failed, predictions.failed[:5]
    assert predictions.answered > 0
    assert followed_s is not None, "the replica did not follow the learner after the kill"
    # The replica's weight stream started on the first node too; it logs its own switch when
    # that node was the one killed.
    if node == cluster.nodes[0].node:
        assert f"fails over from broker node {node}" in replica_log
