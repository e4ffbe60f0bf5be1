"""The serving record on the weight stream at the receiver (``weights.verifier``,
``weights.receiver``): the record signed into a header is handed on from an accepted, a
re-signed and an older envelope of the lineage served, before the weights it came with are
applied, and never from a refused or another lineage's envelope; the receiver subscribes to
the held payloads (``<topic>/held/+``) only when someone takes them, and hands on only
version-numbered, non-empty ones."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from livefit.server.config.broker_urls import parse_broker_url
from livefit.server.weights.keys import SigningKey
from livefit.server.weights.receiver import WeightReceiver
from livefit.server.weights.receiver_auth import Authenticator
from livefit.server.weights.verifier import ReceivedWeights
from livefit.server.wire.serving_record import ServingRecord
from tests.weight_envelopes import Weights, envelope

TOPIC = "livefit/demo/weights"
L1, L2 = "1" * 32, "2" * 32


@pytest.fixture(scope="module")
def weights() -> Weights:
    return Weights.of("linear")


@pytest.fixture(scope="module")
def signer() -> SigningKey:
    return SigningKey.generate()


def record(sequence: int, lineage: str = L1, pinned: int | None = None) -> str:
    return ServingRecord("demo", lineage, sequence, pinned=pinned).encode()


@dataclass
class Heard:
    """What a receiver handed on, in order: ("record", sequence) and ("weights", version)."""

    events: list[tuple[str, int]] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)
    held: list[tuple[int, bytes]] = field(default_factory=list)

    def record(self, text: str) -> None:
        self.events.append(("record", ServingRecord.decode(text).sequence))

    def weights(self, received: ReceivedWeights) -> None:
        self.events.append(("weights", received.meta.version))


def receiver(
    weights: Weights, signer: SigningKey, heard: Heard, held: bool = True
) -> WeightReceiver:
    return WeightReceiver(
        parse_broker_url("mqtt://127.0.0.1:9"), "demo", TOPIC, weights.fingerprint,
        heard.weights, Authenticator(signer.public), on_outcome=heard.outcomes.append,
        on_record=heard.record,
        on_held=(lambda v, p: heard.held.append((v, p))) if held else None,
    )  # fmt: skip


def send(
    target: WeightReceiver, signer: SigningKey | None, weights: Weights, version: int,
    serving: str, lineage: str = L1, created_at: float | None = None,
) -> None:  # fmt: skip
    changes = {"serving": serving}
    data = envelope(signer, weights, version=version, lineage=lineage, created_at=created_at,
                    header_changes=changes)  # fmt: skip
    target._process(data)


def test_the_record_is_handed_on_before_the_weights_it_came_with(
    weights: Weights, signer: SigningKey
) -> None:
    heard = Heard()
    target = receiver(weights, signer, heard)
    send(target, signer, weights, 5, record(1, pinned=5))
    assert heard.outcomes == ["accepted"]
    assert heard.events == [("record", 1), ("weights", 5)]  # a late replica: pinned first


def test_re_signed_and_older_envelopes_of_the_lineage_served_hand_it_on(
    weights: Weights, signer: SigningKey
) -> None:
    heard = Heard()
    target = receiver(weights, signer, heard)
    now = time.time()
    send(target, signer, weights, 5, record(1), created_at=now - 5)
    send(target, signer, weights, 5, record(2), created_at=now - 5)  # a move re-signs v5
    send(target, signer, weights, 4, record(3), created_at=now - 6)  # older: its record counts
    assert heard.outcomes == ["accepted", "refreshed", "stale"]
    assert heard.events == [("record", 1), ("weights", 5), ("record", 2), ("record", 3)]


def test_refused_and_other_lineages_envelopes_hand_on_nothing(
    weights: Weights, signer: SigningKey
) -> None:
    heard = Heard()
    target = receiver(weights, signer, heard)
    now = time.time()
    send(target, signer, weights, 5, record(1), created_at=now - 5)
    forger = SigningKey.generate()
    send(target, forger, weights, 6, record(9, pinned=1))  # another key
    send(target, None, weights, 7, record(9, pinned=1))  # unsigned
    send(target, signer, weights, 10**6, record(9, L2), lineage=L2, created_at=now - 60)
    assert heard.outcomes == ["accepted", "bad_signature", "unsigned", "rollback"]
    assert heard.events == [("record", 1), ("weights", 5)]
    send(target, signer, weights, 0, record(0, L2), lineage=L2)  # a new lineage taken
    assert heard.outcomes[-1] == "new_lineage"
    assert heard.events[-2:] == [("record", 0), ("weights", 0)]


def test_an_envelope_without_a_record_hands_on_none(weights: Weights, signer: SigningKey) -> None:
    heard = Heard()
    target = receiver(weights, signer, heard)
    send(target, signer, weights, 1, "")
    assert heard.events == [("weights", 1)]


class Client:
    """paho's client as the receiver's callbacks use it: what was subscribed."""

    def __init__(self) -> None:
        self.topics: list[str] = []

    def subscribe(self, topic: str, qos: int = 0) -> None:
        self.topics.append(topic)


@dataclass
class Message:
    topic: str
    payload: bytes


def test_the_held_payloads_are_subscribed_only_when_taken(
    weights: Weights, signer: SigningKey
) -> None:
    for held, expected in ((True, [TOPIC, f"{TOPIC}/held/+"]), (False, [TOPIC])):
        client = Client()
        receiver(weights, signer, Heard(), held=held)._on_connect(client, None, {}, 0, None)  # type: ignore[arg-type]
        assert client.topics == expected


def test_only_numbered_non_empty_held_payloads_are_handed_on(
    weights: Weights, signer: SigningKey
) -> None:
    heard = Heard()
    target = receiver(weights, signer, heard)
    for topic, payload in (
        (f"{TOPIC}/held/7", b"seven"),
        (f"{TOPIC}/held/8", b""),  # released: the retained message deleted
        (f"{TOPIC}/held/x", b"x"),
        (f"{TOPIC}/held/\u0661", b"arabic-indic one"),
        (f"{TOPIC}/held/{'9' * 19}", b"too long"),
        ("livefit/other/weights/held/3", b"another topic"),
    ):
        target._on_message(None, None, Message(topic, payload))  # type: ignore[arg-type]
    assert heard.held == []  # not on paho's thread: the verifier's worker decodes them
    target._run_tasks()
    assert heard.held == [(7, b"seven")] and heard.outcomes == []


def test_held_payloads_reach_the_receiver_on_the_verifiers_thread_in_order(
    weights: Weights, signer: SigningKey
) -> None:
    threads: list[str] = []
    heard = Heard()
    target = receiver(weights, signer, heard)
    target.on_held = lambda v, p: threads.append(threading.current_thread().name)
    target.start()
    try:
        for version in (3, 4):
            target._on_message(None, None, Message(f"{TOPIC}/held/{version}", b"x"))  # type: ignore[arg-type]
        deadline = time.monotonic() + 5
        while len(threads) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        target.stop()
    assert threads == ["weights-in-demo", "weights-in-demo"]
