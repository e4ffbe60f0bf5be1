"""RejectionWatcher: what the learner says about a publisher's messages.

It reads the model's dead-letter topic and, once, its weights topic on the publisher's own
connection, counts the rejections of that publisher's messages and tells whether any learner
seems to serve the model. It publishes nothing and owns no connection.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode


class RejectionWatcher:
    """Listens, on a publisher's connection, for what the learner says about its messages.

    It subscribes to the model's dead-letter topic, where a learner reports every message it
    rejects (JSON with ``topic``, ``reason``, ``detail`` and the start of the payload), and
    counts the reports of this publisher's messages: those on its topic whose echoed payload
    holds its ``source`` (or was cut before it). It also subscribes to the weights topic until
    the first message: a learner publishes its weights there (retained) from its first start,
    so a retained message means some learner has served this model on this broker.

    ``nothing_listens`` is the heuristic ``livefit publish`` warns on: the broker granted both
    subscriptions, no weights message came and no rejection was reported.
    """

    def __init__(
        self,
        client: mqtt.Client,
        topic: str,
        dead_letter_topic: str,
        weights_topic: str,
        source: str | None,
    ) -> None:
        self.client = client
        self.topic = topic
        self.dead_letter_topic = dead_letter_topic
        self.weights_topic = weights_topic
        self.source = source.encode() if source else None
        self.rejected = 0
        self.first: tuple[str, str] | None = None  # (reason, detail) of the first report
        self.weights_seen = False
        self.granted: dict[str, bool] = {}
        self._pending: dict[int, str] = {}
        self._changed = threading.Condition()
        self._last_report = 0.0

    def start(self, timeout_s: float = 5.0) -> None:
        """Subscribe to both topics and wait (up to ``timeout_s``) for the broker's answers."""
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        with self._changed:
            for topic in (self.dead_letter_topic, self.weights_topic):
                result, mid = self.client.subscribe(topic, qos=1)
                if result == MQTTErrorCode.MQTT_ERR_SUCCESS and mid is not None:
                    self._pending[mid] = topic
            self._changed.wait_for(lambda: not self._pending, timeout_s)

    def wait_for_learner(self, timeout_s: float) -> bool:
        """Before publishing: wait up to ``timeout_s`` for the weights topic's retained message
        (it comes right after the subscription is granted); False when ``nothing_listens``."""
        with self._changed:
            self._changed.wait_for(lambda: not self.nothing_listens, timeout_s)
            return not self.nothing_listens

    def settle(self, quiet_s: float, max_s: float = 10.0) -> None:
        """Wait for late reports: until none came for ``quiet_s`` (at most ``max_s``). When no
        learner seems to be there, only a moment for a retained weights message in flight."""
        start = time.monotonic()
        with self._changed:
            if self.nothing_listens:
                self._changed.wait_for(lambda: not self.nothing_listens, min(quiet_s, 0.25))
                if self.nothing_listens:
                    return
            while True:
                wake = min(max(start, self._last_report) + quiet_s, start + max_s)
                remaining = wake - time.monotonic()
                if remaining <= 0:
                    return
                self._changed.wait(remaining)

    @property
    def watching(self) -> bool:
        """Whether the broker let us read the dead-letter topic (an ACL may not)."""
        return self.granted.get(self.dead_letter_topic, False)

    @property
    def nothing_listens(self) -> bool:
        return (
            self.watching
            and self.granted.get(self.weights_topic, False)
            and not self.weights_seen
            and self.rejected == 0
        )

    def _on_subscribe(
        self, client: mqtt.Client, _userdata: Any, mid: int, reason_codes: list[Any], _props: Any
    ) -> None:
        with self._changed:
            topic = self._pending.pop(mid, None)
            if topic is not None:
                self.granted[topic] = bool(reason_codes) and not reason_codes[0].is_failure
            self._changed.notify_all()

    def _on_message(self, client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        if message.topic == self.weights_topic:
            with self._changed:
                first = not self.weights_seen
                self.weights_seen = True
                self._changed.notify_all()
            if first:
                client.unsubscribe(self.weights_topic)  # one is enough; they are large
            return
        report = _rejection_report(bytes(message.payload))
        if report is None or report.get("topic") != self.topic or not self._ours(report):
            return
        with self._changed:
            self.rejected += 1
            if self.first is None:
                self.first = (str(report.get("reason")), str(report.get("detail")))
            self._last_report = time.monotonic()
            self._changed.notify_all()

    def _ours(self, report: dict[str, Any]) -> bool:
        if self.source is None or report.get("payload_truncated"):
            return True
        try:
            echoed = base64.b64decode(str(report.get("payload_base64", "")), validate=True)
        except ValueError:
            return True
        return self.source in echoed


def _rejection_report(payload: bytes) -> dict[str, Any] | None:
    try:
        report = json.loads(payload)
    except ValueError:
        return None
    return report if isinstance(report, dict) else None
