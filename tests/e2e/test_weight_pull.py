"""Pulls of large snapshots by a real replica, against hostile messages and hostile servers.

A replica (its own process, a real mosquitto) is configured with the learner's public key, a
bearer token and a pull origin: a recording HTTP server on 127.0.0.1 standing in for the
learner. A second recording server is the attacker's. Manifests that are unsigned, signed by
another key, or that name the attacker's URL never cause a request to the attacker, and the
token goes only to the origin; a pulled body longer than the signed size is aborted after a
small part of it arrived; a manifest over ``weights.max_pull_bytes`` is not fetched at all.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from livefit.local_servers import LivefitProcess
from livefit.server.runtime.mosquitto import Mosquitto
from livefit.server.weights.format import seal, sha256_hex, signed_message
from livefit.server.weights.keys import SigningKey
from tests.configs import learner_config, model
from tests.weight_envelopes import Weights, envelope, payload

TOPIC = "hostile/weights"
TOKEN = "pull-secret-token-31"
MAX_PULL = 65536
FLOOD_BYTES = 100 * 1024 * 1024
LINEAGE = "c" * 32


@dataclass
class Recorded:
    path: str
    authorization: str | None


@dataclass
class Origin:
    """What a recording server answers, and what it saw."""

    payloads: dict[str, bytes] = field(default_factory=dict)  # path -> body
    flood: bool = False
    requests: list[Recorded] = field(default_factory=list)
    sent: int = 0
    done: threading.Event = field(default_factory=threading.Event)


class RecordingServer:
    def __init__(self) -> None:
        self.state = Origin()
        state = self.state

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                state.requests.append(Recorded(self.path, self.headers.get("Authorization")))
                try:
                    if state.flood:
                        self._flood()
                    elif self.path in state.payloads:
                        body = state.payloads[self.path]
                        self.send_response(200)
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                    else:
                        self.send_error(404)
                finally:
                    state.done.set()

            def _flood(self) -> None:
                self.send_response(200)
                self.send_header("Connection", "close")  # no length: the body runs until close
                self.end_headers()
                chunk = b"\0" * 65536
                try:
                    while state.sent < FLOOD_BYTES:
                        self.wfile.write(chunk)
                        state.sent += len(chunk)
                except OSError:  # the client hung up
                    pass
                self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="http-recorder")
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def reset(self) -> Origin:
        self.state.requests.clear()
        self.state.payloads.clear()
        self.state.flood, self.state.sent = False, 0
        self.state.done.clear()
        return self.state

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@dataclass
class Setup:
    replica: LivefitProcess
    origin: RecordingServer
    attacker: RecordingServer
    key: SigningKey
    weights: Weights
    publish: Callable[..., None]


@pytest.fixture(scope="module")
def setup(broker: Mosquitto, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    workdir = tmp_path_factory.mktemp("pull")
    origin, attacker = RecordingServer(), RecordingServer()
    key, weights = SigningKey.generate(), Weights.of("linear", experts=True)  # as learners build
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()

    def publish(message: bytes, retain: bool = False) -> None:
        client.publish(TOPIC, message, qos=1, retain=retain).wait_for_publish(5)

    # A first real snapshot, retained, so the replica becomes ready.
    publish(envelope(key, weights, topic=TOPIC, version=1, lineage=LINEAGE), retain=True)
    weights_table = (
        f'topic = "{TOPIC}"\nverify_key = "{key.public.base64()}"\npull_url = "{origin.url}"\n'
        f"pull_timeout_s = 10\nmax_pull_bytes = {MAX_PULL}"
    )
    config = learner_config(
        broker, workdir / "data", f"pull-{broker.port}", model(weights=weights_table),
        broker_lines=f'[http]\ntoken = "{TOKEN}"',
    )  # fmt: skip
    replica = LivefitProcess(config, workdir, command="replica")
    try:
        replica.start()
        yield Setup(replica, origin, attacker, key, weights, publish)
    finally:
        replica.stop()
        publish(b"", retain=True)  # clear the retained message
        client.disconnect()
        client.loop_stop()
        origin.stop()
        attacker.stop()


def outcome(replica: LivefitProcess, name: str) -> float:
    return replica.metric("livefit_weights_received_total", model="demo", outcome=name)


def expect(s: Setup, name: str, message: bytes) -> None:
    """Publish ``message`` and wait for the replica to count it under ``name``."""
    before = outcome(s.replica, name)
    s.publish(message)
    seen = s.replica.wait_for_metric("livefit_weights_received_total", before + 1, timeout=15,
                                     model="demo", outcome=name)  # fmt: skip
    assert seen == before + 1, name


def manifest(signer: SigningKey | None, s: Setup, version: int, data: bytes,
             size: int | None = None, **extra: object) -> bytes:  # fmt: skip
    """A manifest for ``data``; ``extra`` keys go into the (signed) header as they are."""
    header = {
        "format": 1, "kind": "manifest", "topic": TOPIC, "model": "demo", "lineage": LINEAGE,
        "version": version, "created_at": time.time(), "signed_at": time.time(),
        "size": len(data) if size is None else size, "sha256": sha256_hex(data),
        "fingerprint": s.weights.fingerprint, "key_id": signer.key_id if signer else "",
        **extra,
    }  # fmt: skip
    header_bytes = json.dumps(header, sort_keys=True).encode()
    signature = signer.sign(signed_message(header_bytes)) if signer else b""
    return seal(header_bytes, signature, b"", b"")


def serving_version(replica: LivefitProcess) -> int:
    return int(replica.metric("livefit_serving_version", model="demo"))


def wait_serving(replica: LivefitProcess, version: int, timeout: float = 10) -> int:
    """The serving version once it is ``version`` (or after ``timeout``): an accepted message
    is counted when its weights are handed over, the gauge set after the swap that follows."""
    deadline = time.monotonic() + timeout
    while serving_version(replica) != version and time.monotonic() < deadline:
        time.sleep(0.05)
    return serving_version(replica)


def test_unsigned_or_forged_manifests_never_reach_any_server(setup: Setup) -> None:
    origin, attacker = setup.origin.reset(), setup.attacker.reset()
    data = payload(setup.weights, version=10**9, lineage=LINEAGE)
    evil = f"{setup.attacker.url}/v1/models/demo/weights?version={10**9}"
    old_style = json.dumps({"kind": "livefit-weights-manifest", "model": "demo",
                            "version": 10**9, "size": len(data), "sha256": sha256_hex(data),
                            "url": evil, "created_at": time.time()}).encode()  # fmt: skip
    expect(setup, "unsigned", old_style)
    expect(setup, "unsigned", manifest(None, setup, 10**9, data, url=evil))
    expect(setup, "bad_signature", manifest(SigningKey.generate(), setup, 10**9, data, url=evil))
    time.sleep(0.5)
    assert attacker.requests == [] and origin.requests == []
    assert serving_version(setup.replica) < 10**9


def test_signed_manifest_is_pulled_from_the_origin_only_with_the_token(setup: Setup) -> None:
    origin, attacker = setup.origin.reset(), setup.attacker.reset()
    version = serving_version(setup.replica) + 1
    data = payload(setup.weights, version=version, lineage=LINEAGE)
    origin.payloads[f"/v1/models/demo/weights?version={version}"] = data
    evil = f"{setup.attacker.url}/steal"
    expect(setup, "accepted", manifest(setup.key, setup, version, data, url=evil))
    assert wait_serving(setup.replica, version) == version
    assert attacker.requests == []
    assert [r.path for r in origin.requests] == [f"/v1/models/demo/weights?version={version}"]
    assert origin.requests[0].authorization == f"Bearer {TOKEN}"


def test_a_body_longer_than_signed_is_aborted_early(setup: Setup) -> None:
    origin = setup.origin.reset()
    origin.flood = True
    served = serving_version(setup.replica)
    data = payload(setup.weights, version=served + 1, lineage=LINEAGE)
    expect(setup, "too_large", manifest(setup.key, setup, served + 1, data, size=40_000))
    assert origin.done.wait(15), "the server kept sending"
    assert len(origin.requests) == 1
    assert origin.sent < FLOOD_BYTES // 5, f"{origin.sent} bytes left before the abort"
    assert serving_version(setup.replica) == served


def test_a_manifest_over_max_pull_bytes_is_not_fetched(setup: Setup) -> None:
    origin = setup.origin.reset()
    served = serving_version(setup.replica)
    data = payload(setup.weights, version=served + 1, lineage=LINEAGE)
    expect(setup, "too_large", manifest(setup.key, setup, served + 1, data, size=MAX_PULL + 1))
    time.sleep(0.3)
    assert origin.requests == []
    assert serving_version(setup.replica) == served


def test_inline_weights_need_no_pull(setup: Setup) -> None:
    origin = setup.origin.reset()
    version = serving_version(setup.replica) + 1
    expect(setup, "accepted", envelope(setup.key, setup.weights, topic=TOPIC, version=version,
                                       lineage=LINEAGE))  # fmt: skip
    assert origin.requests == [] and wait_serving(setup.replica, version) == version
