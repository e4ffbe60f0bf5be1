"""Slow clients (the slowloris pattern): thousands of connections that never finish their
request head, held open while well-behaved clients are served (the overload benchmark)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import Row, Spread, paired_ratios
from bench.load import LoadResult
from livefit.local_servers import LivefitProcess

SLOW_LINE_S = 5.0  # one header line this often
PARTIAL_HEAD = b"POST /v1/models/over:predict HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def with_slow_clients(
    server: LivefitProcess,
    count: int,
    capacity: LoadResult,
    load: Callable[[float, Path], LoadResult],
    workdir: Path,
) -> dict[str, Any]:
    """The capacity run (``load(seconds, workdir)``) again while ``count`` slow clients are
    connected (each sends its request head one line every ``SLOW_LINE_S``, never finishing
    it), opened first."""
    import psutil

    process = psutil.Process(server.pid)
    before = process.num_fds()
    with SlowClients(server.port, count) as clients:
        time.sleep(1.0)  # the server has taken them all in (or turned them away)
        held = process.num_fds()
        result = load(capacity.seconds, workdir / "load")
        held = max(held, process.num_fds())
        still = clients.still_connected()
    return {
        "clients": count,
        "rps": result.ok_rps,
        "p99_ms": result.p99_ms,
        "errors": result.errors,
        "capacity_rps": capacity.ok_rps,
        "descriptors": held - before,
        "still_connected": still,
    }


class SlowClients:
    """``count`` connections that each send a request line, then one header line every
    ``SLOW_LINE_S`` (the slowloris pattern), from a thread; opened a hundred at a time."""

    def __init__(self, port: int, count: int) -> None:
        self.port = port
        self.count = count
        self.socks: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trickle, name="slow-clients", daemon=True)

    def __enter__(self) -> SlowClients:
        for first in range(0, self.count, 100):
            for _ in range(min(100, self.count - first)):
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
                sock.sendall(PARTIAL_HEAD)
                sock.setblocking(False)
                self.socks.append(sock)
            time.sleep(0.02)  # the server's accept queue is not a test subject here
        self._thread.start()
        return self

    def _trickle(self) -> None:
        line = 0
        while not self._stop.wait(SLOW_LINE_S):
            line += 1
            for sock in self.socks:
                with contextlib.suppress(OSError):
                    sock.send(f"X-Slow-{line}: a\r\n".encode())

    def still_connected(self) -> int:
        """How many the server has not closed (nor answered: a 408 comes before the close)."""
        open_ = 0
        for sock in self.socks:
            try:
                sock.recv(1, socket.MSG_PEEK)  # a 408, or the end: the server is done with it
            except BlockingIOError:
                open_ += 1  # nothing to read: still connected
            except OSError:
                pass  # reset: closed
        return open_

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for sock in self.socks:
            sock.close()


def slow_row(count: int, clients: int, max_connections: int, runs: list[dict[str, Any]]) -> Row:
    """The runs with ``count`` slow clients next to ``clients`` well-behaved ones."""
    row = Row(case={"load": f"{count:,} slow clients + {clients} well-behaved"})
    f = row.figures
    f["capacity req/s"] = Spread.of([o["capacity_rps"] for o in runs], "req/s")
    f["req/s"] = Spread.of([o["rps"] for o in runs], "req/s")
    f["200 p99 ms"] = Spread.of([o["p99_ms"] for o in runs], "ms")
    f["descriptors held"] = Spread.of([float(o["descriptors"]) for o in runs], "")
    f["slow ones still connected"] = Spread.of([float(o["still_connected"]) for o in runs], "")
    row.ratios["req/s ÷ capacity"] = paired_ratios(
        [o["rps"] for o in runs], [o["capacity_rps"] for o in runs]
    )
    row.target("req/s ÷ capacity", ">=", 0.8, "well-behaved clients served at ≥ 0.8x capacity")
    row.target("descriptors held", "<=", max_connections, "descriptors ≤ http.max_connections")
    return row
