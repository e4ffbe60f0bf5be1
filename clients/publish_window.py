"""The publisher's bounded in-flight window (``PublishWindow``, an object a ``SamplePublisher``
owns).

Counts the messages handed to paho and not yet acknowledged (QoS 1) or written (QoS 0): a message
takes a slot before it is published and waits while ``window`` (or the broker's Receive Maximum)
are in flight; the publisher's paho callbacks free slots and count acknowledgements, broker
rejections and messages lost to a disconnection. A wait gives up only when no acknowledgement
arrived for ``ack_timeout_s``. It knows nothing of MQTT beyond those counts: the publisher says
what each paho event means for them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

MAX_WINDOW = 65_535  # paho's message ids; beyond this publish() fails with MQTT_ERR_QUEUE_SIZE


class PublishWindow:
    """At most ``window`` messages in flight; thread-safe (the publishing thread takes slots,
    paho's thread frees them)."""

    def __init__(self, window: int, ack_timeout_s: float) -> None:
        if not 1 <= window <= MAX_WINDOW:
            raise ValueError(f"window must be between 1 and {MAX_WINDOW}, got {window}")
        self.window = window
        self.ack_timeout_s = ack_timeout_s
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

    @property
    def rejected(self) -> int:
        """Acknowledgements so far that carried a failure reason code."""
        return self._rejected

    @property
    def dropped(self) -> int:
        """Messages so far that left the window unsent (QoS 0 lost to a disconnection)."""
        return self._dropped

    def limit_to(self, receive_maximum: int) -> None:
        """Keep at most ``receive_maximum`` in flight (the broker's, from its CONNACK), and never
        more than ``window``."""
        with self._lock:
            self._limit = min(self.window, receive_maximum)
            self._lock.notify_all()

    def acquire(self) -> bool:
        """Take a slot, waiting while the window is full; False (no slot taken) after
        ``ack_timeout_s`` without an acknowledgement."""
        with self._lock:
            if not self._wait_for(lambda: self._in_flight < self._limit, None):
                return False
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            return True

    def release(self, dropped: int = 0) -> None:
        """Free a slot whose message will never be acknowledged; ``dropped``: it was lost."""
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            self._dropped += dropped
            self._lock.notify_all()

    def acknowledged(self, failed: bool) -> None:
        """Free a slot for an acknowledgement (``failed``: the broker rejected the message)."""
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            self._acks += 1
            if failed:
                self._rejected += 1
            self._lock.notify_all()

    def drop_all(self) -> None:
        """Free every slot, counting its message as dropped (QoS 0 across a disconnection)."""
        with self._lock:
            self._dropped += self._in_flight
            self._in_flight = 0
            self._lock.notify_all()

    def wait_empty(self, timeout_s: float | None = None) -> bool:
        """Wait until nothing is in flight; False if no ack came for timeout_s (ack_timeout_s)."""
        with self._lock:
            return self._wait_for(lambda: self._in_flight == 0, timeout_s)

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
