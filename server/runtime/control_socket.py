"""Operator moves from a split learner's serving processes to its training process, the one
writer of the serving record: a Unix socket in the group's private (0700) directory, one JSON
request and one JSON answer per connection (moves are rare; each serving process asks in a
worker thread).

Request: ``{"model", "action", "label", "version", "mode"}``; answer: ``{"record": {...}}`` or
``{"status": N, "error": "..."}`` (``MoveRefused``). The training process answers each
connection on its own thread, so a slow move (a rollback waiting for the trainer) holds up
no other.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from ..serve.version_book import Move, MoveRefused
from ..wire.serving_record import ServingRecord

log = logging.getLogger(__name__)
CONTROL_FILE = "control.sock"
ANSWER_TIMEOUT_S = 60.0  # longer than a rollback's wait for the trainer
MAX_MESSAGE_BYTES = 1 << 20

Mover = Callable[[str, Move], ServingRecord]


class ControlServer:
    """Training side: answers moves on ``<directory>/control.sock`` with ``mover``."""

    def __init__(self, directory: Path, mover: Mover) -> None:
        self.path = directory / CONTROL_FILE
        self.mover = mover
        self._server: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.path.unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self.path))
        os.chmod(self.path, 0o600)
        server.listen(16)
        self._server = server
        self._thread = threading.Thread(target=self._accept, name="version-control", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                server.close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        self.path.unlink(missing_ok=True)

    def _accept(self) -> None:
        while self._server is not None:
            try:
                sock, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(sock,), daemon=True).start()

    def _answer(self, sock: socket.socket) -> None:
        with sock:
            try:
                request = json.loads(_read_line(sock))
                move = Move(
                    str(request["action"]), request.get("label"), request.get("version"),
                    str(request.get("mode", "serve")),
                )  # fmt: skip
                answer: dict[str, object] = {
                    "record": self.mover(str(request["model"]), move).as_json()
                }
            except MoveRefused as exc:
                answer = {"status": exc.status, "error": exc.message}
            except Exception as exc:  # a move that failed unexpectedly: said, never silent
                log.exception("version control: a move failed")
                answer = {"status": 500, "error": f"{type(exc).__name__}: {exc}"}
            with contextlib.suppress(OSError):
                sock.sendall(json.dumps(answer).encode() + b"\n")


class ControlClient:
    """Serving side: sends a move to the training process and returns its record."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / CONTROL_FILE

    def move(self, name: str, move: Move) -> ServingRecord:
        request = {"model": name, **asdict(move)}
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(ANSWER_TIMEOUT_S)
                sock.connect(str(self.path))
                sock.sendall(json.dumps(request).encode() + b"\n")
                answer = json.loads(_read_line(sock))
        except (OSError, ValueError) as exc:
            raise MoveRefused(503, f"the training process did not answer ({exc}); retry") from None
        if "record" not in answer:
            raise MoveRefused(int(answer.get("status", 500)), str(answer.get("error")))
        return ServingRecord.decode(json.dumps(answer["record"]))


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_MESSAGE_BYTES:
            raise ValueError("a control message over 1 MiB")
    return data
