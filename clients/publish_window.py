"""The publisher's bounded in-flight window (``PublishWindow``, ``SamplePublisher``'s base class).

Owns the count of messages handed to paho and not yet acknowledged (QoS 1) or written (QoS 0):
a message takes a slot before it is published and waits while ``window`` (or the broker's
Receive Maximum) are in flight; paho's callbacks free slots and count acknowledgements,
broker rejections and QoS 0 messages lost to a disconnection. A wait fails with
``PublishTimeout`` only when no acknowledgement arrived for ``ack_timeout_s``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.reasoncodes import ReasonCode

from livefit.server.mqtt.broker import BrokerAddress

from .publish_results import PublishError, PublishTimeout

MAX_WINDOW = 65_535  # paho's message ids; beyond this publish() fails with MQTT_ERR_QUEUE_SIZE


class PublishWindow:
    """At most ``window`` messages in flight (the base class of ``SamplePublisher``)."""

    # The publisher's own settings this part reads (set by SamplePublisher.__init__).
    window: int
    qos: int
    ack_timeout_s: float
    address: BrokerAddress

    def _init_window(self, window: int) -> None:
        """The window's state; ``SamplePublisher.__init__`` calls this once."""
        self._lock = threading.Condition()
        self._in_flight = 0
        self._max_in_flight = 0
        self._limit = window  # lowered to the broker's Receive Maximum on connect
        self._acks = 0
        self._rejected = 0
        self._dropped = 0

    @property
    def in_flight(self) -> int:
        """Messages handed to paho and not yet acknowledged (QoS 1) or written (QoS 0)."""
        return self._in_flight

    @property
    def max_in_flight(self) -> int:
        """The most messages ever in flight at once; never more than ``window``."""
        return self._max_in_flight

    def _on_publish(
        self, _client: Any, _userdata: Any, _mid: int, reason_code: ReasonCode, _props: Any
    ) -> None:
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            self._acks += 1
            if reason_code.is_failure:
                self._rejected += 1
            self._lock.notify_all()

    def _on_disconnect(self, *_: Any) -> None:
        if self.qos == 0:  # paho drops unsent QoS 0 packets on reconnect; they never get acked
            with self._lock:
                self._dropped += self._in_flight
                self._in_flight = 0
                self._lock.notify_all()

    def _acquire_slot(self) -> None:
        with self._lock:
            if not self._wait_for(lambda: self._in_flight < self._limit, None):
                raise self._timeout(f"with the window of {self.window} full")
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)

    def _release_slot(self, dropped: int = 0) -> None:
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            self._dropped += dropped
            self._lock.notify_all()

    def _wait_for(self, condition: Callable[[], bool], timeout_s: float | None) -> bool:
        """With the lock held: wait until ``condition``; False after timeout_s without an ack."""
        timeout_s = self.ack_timeout_s if timeout_s is None else timeout_s
        acks, progress_at = self._acks, time.monotonic()
        while not condition():
            if self._acks != acks:
                acks, progress_at = self._acks, time.monotonic()
            remaining = progress_at + timeout_s - time.monotonic()
            if remaining <= 0:
                return False
            self._lock.wait(remaining)
        return True

    def _check_result(self, rc: MQTTErrorCode) -> None:
        if rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
            return
        if rc == MQTTErrorCode.MQTT_ERR_NO_CONN:
            if self.qos == 1:
                return  # paho keeps it and sends it after reconnecting; on_publish follows
            self._release_slot(dropped=1)
            return
        self._release_slot()
        raise PublishError(f"paho refused the message: {mqtt.error_string(rc)}")

    def _timeout(self, when: str) -> PublishTimeout:
        return PublishTimeout(
            f"{self._in_flight} messages unacknowledged {when}: no PUBACK from the broker at "
            f"{self.address} for {self.ack_timeout_s:g} s"
        )
