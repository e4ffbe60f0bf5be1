"""Authenticated weights at the receiver (``weights.receiver``): the envelope format, the
verification policy and freshness, refusals logged and counted, pulls. The keys:
``test_keys.py`` and ``test_receiver_auth.py``; the payload: ``test_format.py``.

These run a ``WeightReceiver``'s checks on crafted messages, in process and without a network
(the same code replicas and ``WeightSubscriber`` run on every message they receive). The
end-to-end versions, through a real broker and real processes, are in test_weight_stream.py
and test_weight_pull.py; the key files through real processes in test_weight_keys.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import threading
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from livefit.server.config.broker_urls import parse_broker_url
from livefit.server.weights.format import (
    MAGIC,
    SIGNING_CONTEXT,
    open_envelope,
)
from livefit.server.weights.keys import (
    SigningKey,
)
from livefit.server.weights.receiver import WeightReceiver
from livefit.server.weights.receiver_auth import Authenticator
from livefit.server.weights.verifier import ReceivedWeights
from tests.weight_envelopes import Weights, envelope, forged, payload, signed_for

TOPIC = "livefit/demo/weights"
L1, L2 = "1" * 32, "2" * 32


@pytest.fixture(scope="module")
def weights() -> Weights:
    return Weights.of("linear")


@pytest.fixture(scope="module")
def signer() -> SigningKey:
    return SigningKey.generate()


class Recorder:
    """A receiver that is never connected: messages go straight to its checks."""

    def __init__(
        self, weights: Weights, auth: Authenticator, max_age_s: float = 86400,
        refused_unready_s: float = 0.0,
    ) -> None:  # fmt: skip
        self.outcomes: list[str] = []
        self.applied: list[ReceivedWeights] = []
        self.receiver = WeightReceiver(
            parse_broker_url("mqtt://127.0.0.1:9"), "demo", TOPIC, weights.fingerprint,
            self.applied.append, auth, on_outcome=self.outcomes.append, max_age_s=max_age_s,
            refused_unready_s=refused_unready_s,
        )  # fmt: skip

    def send(self, data: bytes) -> str:
        """Process one message; return its outcome."""
        self.receiver._process(data)
        return self.outcomes[-1]


def test_envelope_layout_is_what_the_readme_says(weights: Weights, signer: SigningKey) -> None:
    """An independent verifier: split by the documented layout, check with plain cryptography."""
    data = envelope(signer, weights, version=7, lineage=L1)
    assert data[:4] == MAGIC == b"LFW1"
    (header_len,) = struct.unpack(">I", data[4:8])
    header_bytes = data[8 : 8 + header_len]
    (sig_len,) = struct.unpack(">H", data[8 + header_len : 10 + header_len])
    signature = data[10 + header_len : 10 + header_len + sig_len]
    at = 10 + header_len + sig_len
    (mac_len,) = struct.unpack(">H", data[at : at + 2])
    body = data[at + 2 + mac_len :]
    assert (sig_len, mac_len) == (64, 0)
    public = Ed25519PublicKey.from_public_bytes(signer.public.raw)
    public.verify(signature, b"livefit-weights-v1\x00" + header_bytes)  # raises if wrong
    assert SIGNING_CONTEXT == b"livefit-weights-v1\x00"
    header = json.loads(header_bytes)
    assert set(header) == {
        "format", "kind", "topic", "model", "lineage", "version", "created_at", "signed_at",
        "size", "sha256", "fingerprint", "key_id", "description_sha256",
    }  # fmt: skip
    assert (header["format"], header["kind"], header["topic"]) == (1, "weights", TOPIC)
    assert (header["model"], header["lineage"], header["version"]) == ("demo", L1, 7)
    assert header["size"] == len(body) and header["sha256"] == hashlib.sha256(body).hexdigest()
    assert header["key_id"] == hashlib.sha256(signer.public.raw).hexdigest()[:16]
    parsed = open_envelope(data)
    assert parsed.header.version == 7 and parsed.body == body


def test_the_signed_description_hash_must_match_the_payloads(signer: SigningKey) -> None:
    """A header naming another description than the payload carries is refused; a header of a
    learner without descriptions (none named) leaves it to the payload's sha256, which binds it."""
    described = Weights.of("linear")
    recorder = Recorder(described, Authenticator(signer.public))
    other = {"description_sha256": "0" * 64}
    assert recorder.send(envelope(signer, described, version=1, header_changes=other)) == (
        "bad_payload"
    )
    none = {"description_sha256": ""}
    assert recorder.send(envelope(signer, described, version=2, header_changes=none)) == (
        "accepted"
    )


def test_forged_and_malformed_messages_are_refused(weights: Weights, signer: SigningKey) -> None:
    recorder = Recorder(weights, Authenticator(signer.public))
    for expected, message in forged(weights, signer):
        assert recorder.send(message) == expected, expected
    assert recorder.applied == [] and recorder.receiver.version is None
    assert recorder.send(envelope(signer, weights, version=3)) == "accepted"
    assert recorder.receiver.version == 3


def test_payload_must_say_what_its_envelope_says(weights: Weights, signer: SigningKey) -> None:
    recorder = Recorder(weights, Authenticator(signer.public))
    data = payload(weights, version=5, lineage=L1)
    assert recorder.send(signed_for(signer, weights, data, version=6)) == "bad_payload"


def test_hmac_is_checked_when_configured(weights: Weights, signer: SigningKey) -> None:
    recorder = Recorder(weights, Authenticator(signer.public, hmac_key=b"shared"))
    assert recorder.send(envelope(signer, weights, version=1)) == "unsigned"
    assert recorder.send(envelope(signer, weights, version=1, hmac_key=b"other")) == "bad_hmac"
    assert recorder.send(envelope(signer, weights, version=1, hmac_key=b"shared")) == "accepted"
    hmac_only = Recorder(weights, Authenticator(None, hmac_key=b"shared"))
    assert hmac_only.send(envelope(signer, weights, version=1, hmac_key=b"shared")) == "accepted"
    assert hmac_only.send(envelope(None, weights, version=2)) == "unsigned"


def test_allow_unsigned_accepts_unsigned_envelopes(weights: Weights) -> None:
    with pytest.raises(ValueError):
        Authenticator()
    recorder = Recorder(weights, Authenticator(allow_unsigned=True))
    assert recorder.send(envelope(None, weights, version=1)) == "accepted"


def test_freshness_lineages_and_replays(weights: Weights, signer: SigningKey) -> None:
    recorder = Recorder(weights, Authenticator(signer.public), max_age_s=3600)
    now = time.time()
    send = recorder.send
    old_l1 = envelope(signer, weights, version=5, lineage=L1, created_at=now - 60)
    assert send(old_l1) == "accepted"
    assert send(old_l1) == "stale"  # the same message again
    assert (
        send(envelope(signer, weights, version=5, lineage=L1, created_at=now - 60)) == "refreshed"
    )
    assert send(envelope(signer, weights, version=4, lineage=L1, created_at=now - 30)) == "stale"
    assert send(envelope(signer, weights, version=6, lineage=L1, created_at=now - 50)) == "accepted"
    # The learner restarted with new storage: versions start again, in another lineage.
    assert (
        send(envelope(signer, weights, version=0, lineage=L2, created_at=now - 10)) == "new_lineage"
    )
    assert (recorder.receiver.lineage, recorder.receiver.version) == (L2, 0)
    assert send(envelope(signer, weights, version=1, lineage=L2, created_at=now - 5)) == "accepted"
    # An old snapshot of the previous lineage replayed (validly signed, larger version).
    assert (
        send(envelope(signer, weights, version=10**6, lineage=L1, created_at=now - 40))
        == "rollback"
    )
    assert send(old_l1) == "rollback"
    # Signed too long ago: refused whatever the state.
    stale_signature = envelope(signer, weights, version=9, lineage=L2, created_at=now - 7200,
                               signed_at=now - 7200)  # fmt: skip
    assert send(stale_signature) == "expired"
    assert [w.meta.version for w in recorder.applied] == [5, 6, 0, 1]


def refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "refused (" in r.getMessage()]  # fmt: skip


def test_refusals_are_logged_once_per_outcome_per_interval_and_each_counted(
    weights: Weights, signer: SigningKey, caplog: pytest.LogCaptureFixture
) -> None:
    """2,000 garbage messages on a replica's weight topic logged 1,908 WARNING lines
    (outside attack, issue 45); a rotated key one per snapshot, forever."""
    recorder = Recorder(weights, Authenticator(signer.public))
    rotated = SigningKey.generate()
    caplog.set_level(logging.WARNING)
    for n in range(2000):
        recorder.send(b"garbage %d" % n)
        if n % 10 == 0:
            recorder.send(envelope(rotated, weights, version=n + 1))
    assert recorder.outcomes.count("unsigned") == 2000
    assert recorder.outcomes.count("bad_signature") == 200
    lines = refusal_lines(caplog)
    assert len(lines) == 2, lines  # the first of each outcome; the rest within 10 s
    assert any("unsigned" in line for line in lines) and any("bad_signature" in line
                                                             for line in lines)  # fmt: skip
    recorder.receiver._log_limiter.interval_s = 0  # the interval has passed
    recorder.send(b"garbage again")
    assert refusal_lines(caplog)[-1].endswith("(1999 more refused as unsigned since the last line)")


def test_every_message_refused_for_the_set_time_fails_readiness_until_one_verifies(
    weights: Weights, signer: SigningKey, caplog: pytest.LogCaptureFixture
) -> None:
    # 1 s against the 0.3 s of refusals below: room for a test worker that waits for a core
    recorder = Recorder(weights, Authenticator(signer.public), refused_unready_s=1.0)
    receiver = recorder.receiver
    rotated = SigningKey.generate()
    served = envelope(signer, weights, version=1, lineage=L1)
    assert recorder.send(served) == "accepted"
    caplog.set_level(logging.WARNING)
    started = time.monotonic()
    version = 2
    while time.monotonic() - started < 0.3:  # refused, but not for long enough
        assert recorder.send(envelope(rotated, weights, version=version, lineage=L1)) == (
            "bad_signature"
        )
        version += 1
        time.sleep(0.02)
    assert receiver.refusal_problem() is None
    # The served snapshot again (a reconnect's retained message) counts neither way.
    assert recorder.send(served) == "stale"
    while receiver.refusal_problem() is None and time.monotonic() - started < 5:
        recorder.send(envelope(rotated, weights, version=version, lineage=L1))
        version += 1
        time.sleep(0.02)
    problem = receiver.refusal_problem()
    assert problem is not None and time.monotonic() - started >= 1.0
    assert problem.startswith("weights of demo: refused every snapshot for ")
    assert "(last: bad_signature: Ed25519 signature does not verify" in problem
    assert problem.endswith("still serving version 1")
    said = [r.getMessage() for r in caplog.records if "readiness fails" in r.getMessage()]
    assert len(said) == 1 and "every message refused for 1 s" in said[0]
    # One verified message ends it: the learner's re-signed snapshot, or a new version.
    refreshed = envelope(signer, weights, version=1, lineage=L1, signed_at=time.time() + 1)
    assert recorder.send(refreshed) == "refreshed"
    assert receiver.refusal_problem() is None
    assert any("verify again after" in r.getMessage() for r in caplog.records)
    # A new streak starts from its own first refusal.
    assert recorder.send(b"garbage") == "unsigned"
    assert receiver.refusal_problem() is None


def test_a_streak_is_never_unready_when_the_setting_is_0(
    weights: Weights, signer: SigningKey
) -> None:
    recorder = Recorder(weights, Authenticator(signer.public), refused_unready_s=0)
    recorder.send(envelope(signer, weights, version=1))
    recorder.receiver.streak.since = time.monotonic() - 3600  # refusing for an hour
    assert recorder.send(b"garbage") == "unsigned"
    assert recorder.receiver.refusal_problem() is None


def test_messages_dropped_unread_are_counted_superseded(
    weights: Weights, signer: SigningKey
) -> None:
    recorder = Recorder(weights, Authenticator(signer.public))
    for n in range(100):  # the verifier's thread is not started: 64 wait, 36 are dropped
        recorder.receiver.submit(b"garbage %d" % n)
    assert recorder.outcomes == ["superseded"] * 36


def test_a_receiver_with_no_state_refuses_expired_weights(
    weights: Weights, signer: SigningKey
) -> None:
    week_ago = time.time() - 7 * 86400
    old = envelope(signer, weights, version=10**6, created_at=week_ago, signed_at=week_ago)
    assert Recorder(weights, Authenticator(signer.public)).send(old) == "expired"  # default 1 day
    assert Recorder(weights, Authenticator(signer.public), max_age_s=0).send(old) == "accepted"


def test_manifest_without_an_origin_is_not_pulled(weights: Weights, signer: SigningKey) -> None:
    recorder = Recorder(weights, Authenticator(signer.public))
    assert recorder.send(envelope(signer, weights, kind="manifest")) == "pull_failed"


def test_a_pull_the_learner_refuses_names_the_token_setting(
    weights: Weights, signer: SigningKey
) -> None:
    """A replica following several learners sends each model's own ``weights.pull_token``;
    a learner that answers 401 gets a refusal saying which setting to fix, and the right
    token gets the weights."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    created = time.time()
    data = payload(weights, version=1, created_at=created)

    class Learner(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.headers.get("Authorization") != "Bearer token-2":
                self.send_error(401)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Learner)
    thread = threading.Thread(target=server.serve_forever, name="fake-learner")
    thread.start()
    try:
        refused: list[str | None] = []
        for token, outcome in (("token-1", "pull_failed"), ("token-2", "accepted")):
            outcomes: list[str] = []
            receiver = WeightReceiver(
                parse_broker_url("mqtt://127.0.0.1:9"), "demo", TOPIC, weights.fingerprint,
                lambda _: None, Authenticator(signer.public), on_outcome=outcomes.append,
                pull_url=f"http://127.0.0.1:{server.server_address[1]}",
                pull_headers={"Authorization": f"Bearer {token}"}, pull_timeout_s=10,
            )  # fmt: skip
            receiver._process(
                envelope(signer, weights, topic=TOPIC, created_at=created, kind="manifest")
            )
            assert outcomes == [outcome]
            refused.append(receiver.last_refused)
        assert refused[1] is None
        assert refused[0] is not None and refused[0].startswith("pull_failed: GET http://")
        assert "HTTP 401: set weights.pull_token" in refused[0] and "token-1" not in refused[0]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
