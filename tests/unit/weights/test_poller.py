"""``WeightPoller`` (``server/weights/poller.py``) against a stand-in for the learner's HTTP (an
in-process server): it takes what the learner signed, polls an unchanged snapshot with a 304,
takes a manifest's payload from the same poll, and refuses what the learner did not sign, a
payload that is not the signed one, a garbled envelope header and an oversize body."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from livefit.server.weights.format import detached, open_envelope, sha256_hex
from livefit.server.weights.keys import SigningKey
from livefit.server.weights.poller import WeightPoller
from livefit.server.weights.receiver_auth import Authenticator
from livefit.server.weights.verifier import ReceivedWeights
from tests.weight_envelopes import Weights, envelope, payload


@dataclass
class Served:
    """What the stand-in answers: a payload and the X-Weights-Envelope header."""

    body: bytes = b""
    header: str = ""
    requests: list[str] = field(default_factory=list)
    not_modified: int = 0


@pytest.fixture
def server() -> Iterator[tuple[str, Served]]:
    served = Served()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.requests.append(self.path)
            etag = f'"{sha256_hex(served.body)}"'
            if self.headers.get("If-None-Match") == etag:
                served.not_modified += 1
                self.send_response(304)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("ETag", etag)
            if served.header:
                self.send_header("X-Weights-Envelope", served.header)
            self.send_header("Content-Length", str(len(served.body)))
            self.end_headers()
            self.wfile.write(served.body)

        def log_message(self, *_: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", served
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def poll_until(url: str, key: SigningKey, done: Callable[[list[str]], bool],
               max_pull_bytes: int = 10**6) -> tuple[list[str], list[ReceivedWeights]]:  # fmt: skip
    outcomes: list[str] = []
    applied: list[ReceivedWeights] = []
    poller = WeightPoller(url, "demo", "livefit/demo/weights", None, applied.append,
                          Authenticator(key.public), on_outcome=outcomes.append,
                          poll_interval_s=0.02, max_pull_bytes=max_pull_bytes)  # fmt: skip
    poller.start()
    try:
        deadline = time.monotonic() + 10
        while not done(outcomes) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        poller.stop()
    return outcomes, applied


def serve(served: Served, message: bytes, body: bytes | None = None) -> None:
    """Serve ``message``'s payload (or ``body``) with its envelope detached in the header."""
    opened = open_envelope(message)
    served.body = opened.body if body is None else body
    served.header = base64.b64encode(detached(opened)).decode()


def test_signed_snapshots_are_taken_and_unchanged_ones_cost_a_304(
    server: tuple[str, Served],
) -> None:
    url, served = server
    key, weights = SigningKey.generate(), Weights.of("linear")
    serve(served, envelope(key, weights, version=4))
    outcomes, applied = poll_until(url, key, lambda _: served.not_modified >= 3)
    assert outcomes == ["accepted"] and [r.meta.version for r in applied] == [4]
    assert all(path == "/v1/models/demo/weights" for path in served.requests)


def test_a_manifest_is_verified_against_the_payload_of_the_same_poll(
    server: tuple[str, Served],
) -> None:
    url, served = server
    key, weights = SigningKey.generate(), Weights.of("linear")
    manifest = envelope(key, weights, version=6, kind="manifest")
    serve(served, manifest, body=payload(weights, version=6, created_at=open_envelope(
        manifest).header.created_at))  # fmt: skip
    outcomes, applied = poll_until(url, key, lambda seen: bool(seen))
    assert outcomes == ["accepted"] and applied[0].meta.version == 6
    assert not any("version=" in path for path in served.requests)  # no second fetch


@pytest.mark.parametrize("attack", ["no envelope", "another key", "another payload", "garbled",
                                    "oversize"])  # fmt: skip
def test_what_the_learner_did_not_sign_is_refused(server: tuple[str, Served], attack: str) -> None:
    url, served = server
    key, weights = SigningKey.generate(), Weights.of("linear")
    signer = SigningKey.generate() if attack == "another key" else key
    serve(served, envelope(signer, weights, version=9))
    expected = {"no envelope": "unsigned", "another key": "bad_signature",
                "another payload": "bad_sha256", "garbled": "bad_payload",
                "oversize": "too_large"}[attack]  # fmt: skip
    if attack == "no envelope":
        served.header = ""
    if attack == "another payload":
        served.body = payload(weights, version=10)
    if attack == "garbled":
        served.header = "not base64 !"
    limit = len(served.body) - 1 if attack == "oversize" else 10**6
    outcomes, applied = poll_until(url, key, lambda seen: bool(seen), max_pull_bytes=limit)
    assert outcomes[:1] == [expected] and applied == []
