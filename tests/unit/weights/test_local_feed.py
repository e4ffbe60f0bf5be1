"""The split learner's local weight feed over real Unix sockets, attacked at both ends.

- A serving process that connects late gets the newest frame of each model at once; one that
  stops reading (SIGSTOPped) holds up neither the training side's ``send`` nor the others.
- Whatever arrives on the socket (absurd sizes, non-UTF-8 names, status that is not a JSON
  object, a frame cut short), the receiving side refuses it without allocating what a frame
  claims, keeps its thread alive and reconnects. Every forged or broken envelope is refused by
  the same verifier replicas use, counted by outcome, and never reaches the model.
- The weights download of a serving process waits for a version the feed has not brought yet.
"""

from __future__ import annotations

import socket
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from livefit.server.http.weights_api import MAX_WAITING, build_weights_router
from livefit.server.weights.format import sha256_hex
from livefit.server.weights.keys import SigningKey
from livefit.server.weights.local_feed import (
    FEED_FILE,
    LocalWeightFeed,
    LocalWeightSource,
    encode_frame,
)
from livefit.server.weights.receiver_auth import Authenticator
from livefit.server.weights.store import EncodedWeights, WeightStore
from livefit.server.weights.verifier import WeightVerifier
from tests.inprocess import InProcessServer
from tests.weight_envelopes import Weights, envelope, forged


@pytest.fixture
def directory() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="feed-") as found:  # short: a socket path limit
        yield Path(found)


def _wait(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_late_reader_gets_the_newest_and_a_stopped_one_holds_up_nobody(directory: Path) -> None:
    feed = LocalWeightFeed(directory)
    feed.start()
    got: list[bytes] = []
    try:
        feed.send(b"W", "demo", b"old")
        feed.send(b"W", "demo", b"new")
        stopped = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stopped.connect(str(directory / FEED_FILE))  # connects, then never reads
        source = LocalWeightSource(directory / FEED_FILE, {"demo": got.append}, print, 1 << 24)
        source.start()
        _wait(lambda: got == [b"new"])
        started = time.monotonic()
        for i in range(40):  # 40 MB to a reader that takes nothing: send never waits for it
            feed.send(b"W", "demo", bytes([i]) * (1 << 20))
        assert time.monotonic() - started < 2.0
        _wait(lambda: got[-1] == bytes([39]) * (1 << 20))
        source.stop()
        stopped.close()
    finally:
        feed.stop()
    assert not (directory / FEED_FILE).exists()


class _HostileFeed:
    """A feed socket that answers each connection with the next of ``answers`` (raw bytes)."""

    def __init__(self, path: Path, answers: list[bytes]) -> None:
        self.answers = list(answers)
        self.connections = 0
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self.server.accept()
            except OSError:
                return
            with sock:
                answer = self.answers[min(self.connections, len(self.answers) - 1)]
                self.connections += 1
                sock.sendall(answer)
                time.sleep(0.05)


def test_hostile_frames_are_refused_and_the_reader_reconnects(directory: Path) -> None:
    head = struct.Struct(">cH")
    answers = [
        head.pack(b"W", 4) + b"demo" + struct.pack(">Q", 2**62),  # claims 4 EiB
        head.pack(b"W", 2) + b"\xff\xfe" + struct.pack(">Q", 1) + b"x",  # not UTF-8
        encode_frame(b"S", "", b"[1, 2]"),  # status that is not an object
        encode_frame(b"S", "", b"{not json"),
        encode_frame(b"W", "demo", b"0123456789")[:-4],  # cut short
        head.pack(b"W", 4) + b"de",  # cut inside the name
        encode_frame(b"W", "demo", b"last") + encode_frame(b"S", "", b'{"problems": []}'),
    ]
    path = directory / FEED_FILE
    hostile = _HostileFeed(path, answers)
    got: list[bytes] = []
    statuses: list[dict[str, object]] = []
    source = LocalWeightSource(path, {"demo": got.append}, statuses.append, 1 << 20)
    source.start()
    try:
        _wait(lambda: statuses == [{"problems": []}], timeout=15)
        assert got[-1] == b"last" and b"0123456789"[:6] not in got  # nothing from a cut frame
        assert hostile.connections >= len(answers)  # it reconnected after each refusal
        assert source._thread is not None and source._thread.is_alive()
    finally:
        source.stop()
        hostile.server.close()


def test_every_broken_envelope_on_the_feed_is_refused_by_the_verifier(directory: Path) -> None:
    weights, key = Weights.of("linear"), SigningKey.generate()
    accepted: list[int] = []
    outcomes: list[str] = []
    verifier = WeightVerifier(
        "demo", "livefit/demo/weights", weights.fingerprint,
        lambda received: accepted.append(received.meta.version), Authenticator(key.public),
        on_outcome=outcomes.append,
    )  # fmt: skip
    verifier.start()
    feed = LocalWeightFeed(directory)
    feed.start()
    source = LocalWeightSource(directory / FEED_FILE, {"demo": verifier.submit}, print, 1 << 24)
    source.start()
    try:
        _wait(source.connected.is_set)
        cases = [*forged(weights, key), ("unsigned", b""), ("unsigned", b"\x00" * 100)]
        for expected, message in cases:
            before = len(outcomes)
            feed.send(b"W", "demo", message)
            _wait(lambda before=before: len(outcomes) > before)
            assert outcomes[-1] == expected, (expected, outcomes[-1])
        assert accepted == []
        feed.send(b"W", "demo", envelope(key, weights, version=5))
        _wait(lambda: accepted == [5])
    finally:
        source.stop()
        feed.stop()
        verifier.stop()


def test_a_pull_of_a_version_still_on_its_way_waits_for_it() -> None:
    """A split learner's serving process can be asked for the version a manifest named before
    the local feed brought it: the download waits for it (``wait_newer_s``); a version that a
    newer one overtook, or that never comes, is 404; without the wait (the one-process learner,
    replicas) a version not held is 404 at once."""
    store = WeightStore(4)

    def add(version: int) -> None:
        payload = b"weights v%d" % version
        store.add(EncodedWeights(version, payload, sha256_hex(payload), time.time(), "l" * 32))

    def server(wait_newer_s: float) -> InProcessServer:
        app = FastAPI()
        endpoints = {"demo": object()}  # the weights routes only ask which models there are
        app.include_router(build_weights_router(lambda _: store, lambda: endpoints,  # type: ignore[arg-type,return-value]
                                                wait_newer_s=wait_newer_s))  # fmt: skip
        return InProcessServer(app).start()

    def get(at: InProcessServer, version: int) -> tuple[httpx.Response, float]:
        started = time.monotonic()
        answer = httpx.get(f"{at.url}/v1/models/demo/weights?version={version}", timeout=10)
        return answer, time.monotonic() - started

    add(1)
    waiting, short, plain, flood = server(5.0), server(0.3), server(0.0), server(4.0)
    arriving = threading.Timer(0.3, add, (2,))
    try:
        arriving.start()
        answer, _ = get(waiting, 2)
        assert answer.status_code == 200 and answer.content == b"weights v2"
        add(4)  # version 3 was overtaken: it will never come
        answer, took = get(waiting, 3)
        assert answer.status_code == 404 and took < 1.0
        answer, took = get(plain, 5)
        assert answer.status_code == 404 and took < 1.0
        answer, took = get(short, 5)
        assert answer.status_code == 404 and 0.3 <= took < 2.0
        # a flood of pulls for versions that never come: MAX_WAITING wait, the rest are 404 at
        # once (they used to poll the store every 20 ms each, for 5 s)
        with ThreadPoolExecutor(MAX_WAITING + 8) as pool:
            answers = list(pool.map(lambda v: get(flood, v), range(10**6, 10**6 + 40)))
        # "at once": well under the 4 s wait (at -n 3 on 2 cores, 40 immediate 404s through
        # one in-process server took up to about 1 s)
        quick = [took for answer, took in answers if answer.status_code == 404 and took < 2.0]
        assert all(answer.status_code == 404 for answer, _ in answers)
        assert len(quick) >= 40 - MAX_WAITING, sorted(took for _, took in answers)
    finally:
        arriving.join()
        for each in (waiting, short, plain, flood):
            each.stop()
