"""Weights from a split learner's training process to its own serving processes, over a Unix
socket in the group's private (0700) directory: no broker round trip, no size limit of MQTT's.

What travels is exactly what the weight topic carries (a signed envelope, always inline here),
and a serving process verifies it with the same ``WeightVerifier`` a replica uses: one
verification path, whatever the transport. The training process also sends its readiness
problems (JSON) on the same socket, so a serving process's ``/v2/health/ready`` says when the
learner behind it cannot learn.

Frames: one kind byte (``W`` weights, ``S`` status), a 2-byte name length and the model name
(UTF-8; empty for status), an 8-byte body length, the body; integers big-endian.

``LocalWeightFeed`` (training side) keeps the newest frame of each model and the newest status,
and gives every connecting serving process those at once, then each newer one. Each connection
has its own sender thread holding only the newest frame per model: a stopped or slow serving
process never holds up the trainer or the others, and is disconnected after ``SEND_TIMEOUT_S``
(it reconnects and gets the newest). ``LocalWeightSource`` (serving side) connects, reconnects
when the training process restarts, and hands frames to the verifiers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..wire.snapshot import Snapshot
from .publisher import WeightPublisher

log = logging.getLogger(__name__)
FEED_FILE = "weights.sock"
SEND_TIMEOUT_S = 10.0
RECONNECT_S = 0.1
STATUS_INTERVAL_S = 0.5
_HEAD = struct.Struct(">cH")
_SIZE = struct.Struct(">Q")
STATUS_KEY = ""  # the name a status frame is kept under


def encode_frame(kind: bytes, name: str, body: bytes) -> bytes:
    encoded = name.encode("utf-8")
    return _HEAD.pack(kind, len(encoded)) + encoded + _SIZE.pack(len(body)) + body


class _Connection:
    """One serving process's connection: a sender thread with the newest frame per name."""

    def __init__(self, sock: socket.socket, on_close: Callable[[_Connection], None]) -> None:
        self.sock = sock
        self.sock.settimeout(SEND_TIMEOUT_S)
        self.on_close = on_close
        self._pending: dict[str, bytes] = {}
        self._wake = threading.Condition()
        self._closed = False
        self.thread = threading.Thread(target=self._run, name="local-weights-send", daemon=True)
        self.thread.start()

    def offer(self, name: str, frame: bytes) -> None:
        with self._wake:
            self._pending[name] = frame
            self._wake.notify()

    def close(self) -> None:
        """Send what is pending, then close (``thread`` ends then)."""
        with self._wake:
            self._closed = True
            self._wake.notify()

    def _run(self) -> None:
        try:
            while True:
                with self._wake:
                    self._wake.wait_for(lambda: self._closed or bool(self._pending))
                    if self._closed and not self._pending:
                        return
                    frames = list(self._pending.values())
                    self._pending.clear()
                for frame in frames:
                    self.sock.sendall(frame)
        except OSError as exc:
            log.info("a serving process left the local weight feed: %s", exc)
        finally:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.on_close(self)


class LocalWeightFeed:
    """Training side: serves frames on ``<directory>/weights.sock``."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / FEED_FILE
        self._latest: dict[str, bytes] = {}
        self._connections: set[_Connection] = set()
        self._lock = threading.Lock()
        self._server: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._stopping = threading.Event()

    def start(self) -> None:
        """Listen; the socket appears only now (the group's parent waits for it)."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(tmp))
        os.chmod(tmp, 0o600)
        server.listen(64)
        os.replace(tmp, self.path)  # whole and listening, or absent
        self._server = server
        self._acceptor = threading.Thread(
            target=self._accept, name="local-weights-accept", daemon=True
        )
        self._acceptor.start()

    def _accept(self) -> None:
        assert self._server is not None
        while not self._stopping.is_set():
            try:
                sock, _ = self._server.accept()
            except OSError:
                return
            connection = _Connection(sock, self._closed)
            with self._lock:
                self._connections.add(connection)
                latest = dict(self._latest)
            for name, frame in latest.items():
                connection.offer(name, frame)

    def _closed(self, connection: _Connection) -> None:
        with self._lock:
            self._connections.discard(connection)

    def send(self, kind: bytes, name: str, body: bytes) -> None:
        """Keep ``body`` as the newest of ``name`` and hand it to every connection."""
        frame = encode_frame(kind, name, body)
        with self._lock:
            self._latest[name] = frame
            connections = list(self._connections)
        for connection in connections:
            connection.offer(name, frame)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop listening; give each connection ``timeout`` to send what is pending."""
        self._stopping.set()
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)  # wakes accept(); close alone does not
            with contextlib.suppress(OSError):
                self._server.close()
            self._server = None
        if self._acceptor is not None:
            self._acceptor.join(timeout)
            self._acceptor = None
        self.path.unlink(missing_ok=True)
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.close()
        deadline = time.monotonic() + timeout
        for connection in connections:
            connection.thread.join(max(0.0, deadline - time.monotonic()))


class LocalWeightPublisher:
    """Training side, one model: seals each snapshot inline with the model's signing key and
    sends it on the feed; re-seals the newest every ``refresh_interval_s`` (as the weight
    topic's publisher does) so the serving processes' ``max_age_s`` check holds while idle."""

    def __init__(self, feed: LocalWeightFeed, publisher: WeightPublisher) -> None:
        self.feed = feed
        self.publisher = publisher
        self._pending: Snapshot | None = None
        self._wake = threading.Condition()
        self._stopping = False
        self._resend = False  # seal the newest again now (the serving record moved)
        self._thread: threading.Thread | None = None

    def offer(self, snapshot: Snapshot) -> None:
        with self._wake:
            self._pending = snapshot
            self._wake.notify()

    def resend(self) -> None:
        """Seal the newest snapshot again now, with the publisher's current serving record."""
        with self._wake:
            self._resend = True
            self._wake.notify()

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"local-weights-{self.publisher.model}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        publisher, encoded = self.publisher, None
        while True:
            with self._wake:
                self._wake.wait_for(
                    lambda: self._stopping or self._resend or self._pending is not None,
                    publisher.refresh_interval_s,
                )
                snapshot, self._pending, self._resend = self._pending, None, False
                stopping = self._stopping
            try:
                if snapshot is not None:
                    encoded = publisher.encode(snapshot)
                if encoded is not None:
                    data, _ = publisher.seal(encoded, time.time(), inline=True)
                    self.feed.send(b"W", publisher.model, data)
            except Exception:
                log.exception("could not hand weights of %s to the serving processes",
                              publisher.model)  # fmt: skip
            if stopping:
                return


class LocalWeightSource:
    """Serving side: reads the feed at ``path`` and hands each model's frames to
    ``deliver[model]`` (a verifier's ``submit``) and status frames to ``on_status``."""

    def __init__(
        self,
        path: Path,
        deliver: Mapping[str, Callable[[bytes], None]],
        on_status: Callable[[dict[str, object]], None],
        max_frame_bytes: int,
    ) -> None:
        self.path = path
        self.deliver = dict(deliver)
        self.on_status = on_status
        self.max_frame_bytes = max_frame_bytes
        self.connected = threading.Event()
        self.last_error = "not connected yet"
        self._stopping = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="local-weights-in", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.connect(str(self.path))
                    self._sock = sock
                    self.connected.set()
                    self._read(sock)
            except (OSError, ValueError) as exc:  # closed, or a frame that does not parse
                self.last_error = str(exc) or type(exc).__name__
            except Exception as exc:  # never let the feed's thread die: reconnect instead
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("local weight feed: a frame could not be handled")
            finally:
                self._sock = None
                if self.connected.is_set():
                    self.connected.clear()
                    if not self._stopping.is_set():  # the training process stops or restarts
                        log.info("local weight feed: %s; reconnecting", self.last_error)
            self._stopping.wait(RECONNECT_S)

    def _read(self, sock: socket.socket) -> None:
        reader = sock.makefile("rb")
        while not self._stopping.is_set():
            kind, name_size = _HEAD.unpack(_exactly(reader, _HEAD.size))
            name = _exactly(reader, name_size).decode("utf-8")
            (size,) = _SIZE.unpack(_exactly(reader, _SIZE.size))
            if size > self.max_frame_bytes:
                raise ValueError(f"a frame of {size} bytes, over {self.max_frame_bytes}")
            body = _exactly(reader, size)
            if kind == b"S":
                status = json.loads(body)
                if not isinstance(status, dict):
                    raise ValueError(f"a status frame that is not a JSON object: {body[:64]!r}")
                self.on_status(status)
            elif kind == b"W" and name in self.deliver:
                self.deliver[name](body)


def _exactly(reader: Any, size: int) -> bytes:
    """``size`` bytes from ``reader``; ValueError when the feed closes before them."""
    data = reader.read(size)
    if len(data) < size:
        raise ValueError("the training process closed the feed")
    return bytes(data)
