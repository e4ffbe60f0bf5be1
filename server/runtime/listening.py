"""The listening socket every serving process (or a worker group's parent) binds first.

Kept apart from ``http_server`` so that a worker group's parent, which only supervises, binds its
port without importing uvicorn's app, the models or TensorFlow.
"""

from __future__ import annotations

import socket


class StartupError(Exception):
    """A check before start failed; the message says what and what to do (no traceback)."""


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound now; ``StartupError`` naming the address if it is taken."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise StartupError(f"cannot listen on {host}:{port}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        hint = " (another livefit or another program listens there; set http.port)"
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}") from None
    sock.set_inheritable(True)
    return sock
