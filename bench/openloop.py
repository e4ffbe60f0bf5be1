"""An open-loop HTTP/1.1 load generator in its own process: a fixed request rate, whatever the
server answers.

``python -m bench.openloop --url URL --body-file F --rate R --duration S --deadline-ms D
[--connections C] [--max-conns N] [--probe-s P]`` opens C keep-alive connections to 127.0.0.1
before the clock starts, then sends request *i* at ``start + i / R`` for S seconds: on a free
connection when there is one, else on a new one (up to N; beyond that the request waits for
the next free connection). Latency runs from the time a
request was *due*, not from when it could be sent, so a slow server cannot hide its delay
(coordinated omission). A closed loop slows down with the server and hides collapse; this does
not. After the load it sends one probe request every 10 ms for P seconds (how fast the server is
back to normal) and then prints one JSON line: counts by status, latency percentiles of 200s
and 429s, goodput (200s within the deadline answered while the load ran, per second), 200s
within the deadline per second of the run, and every probe.

Status 0 in the counts: no answer before the end (deadline + 2 s after the last request);
-1: the connection failed or closed before the answer.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import deque
from typing import Any

import numpy as np

from bench.loadgen import loopback_body, post_request, run_and_print

PROBE_INTERVAL_S = 0.01


class _Conn(asyncio.Protocol):
    """One keep-alive connection: at most one request in flight."""

    def __init__(self, gen: _Generator) -> None:
        self.gen = gen
        self.buf = bytearray()
        self.due: float | None = None  # when the request in flight was due
        self.sent = 0.0  # when it was written (after ``due`` when this client runs late)
        self.phase = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.gen.connected(self)

    def send(self, due: float, phase: int) -> None:
        self.due, self.phase, self.sent = due, phase, time.monotonic()
        assert self.transport is not None
        self.transport.write(self.gen.request)

    def data_received(self, data: bytes) -> None:
        if not self.buf:  # the usual case: exactly one whole answer (cheap: this is the client)
            end = data.find(b"\r\n\r\n")
            at = data.find(b"content-length: ", 0, end)
            if end > 0 and at > 0:
                stop = data.find(b"\r\n", at)
                if end + 4 + int(data[at + 16 : stop]) == len(data):
                    head = data[:end]
                    self.gen.answered(
                        self, int(data[9:12]), b"\nretry-after:" in head,
                        b"\nconnection: close" in head,
                    )  # fmt: skip
                    return
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).lower()
            at = head.find(b"content-length:")
            length = 0
            if at >= 0:
                stop = head.find(b"\r\n", at)
                length = int(head[at + 15 : stop if stop >= 0 else len(head)])
            total = end + 4 + length
            if len(self.buf) < total:
                return
            del self.buf[:total]
            status = int(head[9:12])
            retry_after = b"\r\nretry-after:" in head
            close = b"\r\nconnection: close" in head
            self.gen.answered(self, status, retry_after, close)

    def connection_lost(self, exc: Exception | None) -> None:
        self.gen.lost(self)


class _Generator:
    def __init__(self, host: str, port: int, request: bytes, max_conns: int) -> None:
        self.host, self.port, self.request = host, port, request
        self.max_conns = max_conns
        self.loop = asyncio.get_running_loop()
        self.idle: list[_Conn] = []
        self.open = 0
        self.connecting = 0
        self.waiting: deque[tuple[float, int]] = deque()  # due requests with no connection
        self.in_flight = 0
        # per phase (0 load, 1 probe): (due, latency s, status, retry_after, sent - due s)
        self.records: tuple[list[tuple[float, float, int, bool, float]], ...] = ([], [])
        self.max_open = 0
        self.max_waiting = 0  # requests due with no free connection, at most

    def due(self, at: float, phase: int) -> None:
        self.in_flight += 1
        if self.idle:
            self.idle.pop().send(at, phase)
            return
        self.waiting.append((at, phase))
        self.max_waiting = max(self.max_waiting, len(self.waiting))
        self._more_connections()

    def _more_connections(self) -> None:
        """One more connection per request waiting for one, up to ``max_conns``."""
        while len(self.waiting) > self.connecting and self.open + self.connecting < self.max_conns:
            self.connecting += 1
            self.loop.create_task(self._connect())

    async def warm(self, connections: int) -> None:
        """Open ``connections`` keep-alive connections before the clock starts, a few at a
        time: the run measures requests, not a storm of new connections (which overflows the
        server's accept queue, and the kernel then drops handshakes for seconds)."""
        for first in range(0, connections, 32):
            batch = min(32, connections - first)
            self.connecting += batch
            await asyncio.gather(*(self._connect() for _ in range(batch)))

    async def _connect(self) -> None:
        try:
            await self.loop.create_connection(lambda: _Conn(self), self.host, self.port)
        except OSError:
            self.connecting -= 1
            if self.waiting:
                at, phase = self.waiting.popleft()
                self._record(phase, at, -1, False)
            await asyncio.sleep(0.01)
            self._more_connections()

    def connected(self, conn: _Conn) -> None:
        self.connecting -= 1
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        self._next(conn)

    def _next(self, conn: _Conn) -> None:
        if self.waiting:
            at, phase = self.waiting.popleft()
            conn.send(at, phase)
        else:
            self.idle.append(conn)

    def answered(self, conn: _Conn, status: int, retry_after: bool, close: bool) -> None:
        assert conn.due is not None
        self._record(conn.phase, conn.due, status, retry_after, conn.sent)
        conn.due = None
        if close:
            assert conn.transport is not None
            conn.transport.close()
        else:
            self._next(conn)

    def lost(self, conn: _Conn) -> None:
        self.open -= 1
        if conn.due is not None:
            self._record(conn.phase, conn.due, -1, False, conn.sent)
            conn.due = None
        if conn in self.idle:
            self.idle.remove(conn)
        self._more_connections()  # the server closed it (idle, or to make room): replace it

    def _record(
        self, phase: int, due: float, status: int, retry_after: bool, sent: float | None = None
    ) -> None:
        self.in_flight -= 1
        now = time.monotonic()
        late = (sent if sent is not None else now) - due
        self.records[phase].append((due, now - due, status, retry_after, late))

    def close(self) -> None:
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.close()


async def _tick(gen: _Generator, rate: float, start: float, seconds: float, phase: int) -> None:
    """Make request i due at ``start + i / rate`` until ``start + seconds``."""
    sent = 0
    total = int(rate * seconds)
    while sent < total:
        now = time.monotonic()
        due_count = min(total, int((now - start) * rate) + 1)
        while sent < due_count:
            gen.due(start + sent / rate, phase)
            sent += 1
        # whole milliseconds: the loop's timers have that resolution, and a shorter sleep
        # would spin (a busy loop costs the CPU the server under test needs)
        await asyncio.sleep(0.001)


async def run(
    url: str, body: bytes, rate: float, seconds: float, deadline_s: float, max_conns: int,
    probe_s: float, connections: int = 256,
) -> dict[str, Any]:  # fmt: skip
    host, port, request = post_request(url, body)
    gen = _Generator(host, port, request, max_conns)
    await gen.warm(min(connections, max_conns))
    start = time.monotonic()
    await _tick(gen, rate, start, seconds, 0)
    stop = time.monotonic()
    if probe_s > 0:
        await _tick(gen, 1 / PROBE_INTERVAL_S, stop, probe_s, 1)
    give_up = time.monotonic() + deadline_s + 2.0
    while gen.in_flight and time.monotonic() < give_up:
        await asyncio.sleep(0.01)
    unanswered = gen.in_flight
    gen.close()
    return _summary(gen, start, stop, seconds, deadline_s, unanswered)


def _summary(
    gen: _Generator, start: float, stop: float, seconds: float, deadline_s: float,
    unanswered: int,
) -> dict[str, Any]:  # fmt: skip
    load = gen.records[0]
    due = np.asarray([r[0] - start for r in load], dtype=np.float64)
    latency = np.asarray([r[1] for r in load], dtype=np.float64)
    status = np.asarray([r[2] for r in load], dtype=np.int64)
    late = np.asarray([r[4] for r in load], dtype=np.float64)
    values, numbers = np.unique(status, return_counts=True)
    counts = {str(int(s)): int(n) for s, n in zip(values, numbers, strict=True)}
    if unanswered:
        counts["0"] = counts.get("0", 0) + unanswered
    done_at = due + latency
    good = (status == 200) & (latency <= deadline_s)
    shed = status == 429
    # goodput: what the server delivered while the load ran (answers to a backlog that come
    # after it are not throughput it sustained)
    good_in_run = int((good & (done_at < seconds)).sum())

    def pct(mask: np.ndarray, q: float) -> float | None:
        return float(np.percentile(latency[mask], q) * 1000) if mask.any() else None

    def late_pct(mask: np.ndarray, q: float) -> float | None:
        return float(np.percentile(late[mask], q) * 1000) if mask.any() else None

    bins = np.arange(0.0, np.ceil(max(seconds, float(done_at.max()) if len(done_at) else 0)) + 1)
    per_second = np.histogram(done_at[good], bins=bins)[0] if len(bins) > 1 else np.zeros(0)
    probes = [[round(r[0] - stop, 4), round(r[1] * 1000, 3), r[2]] for r in sorted(gen.records[1])]
    return {
        "client": "bench.openloop",
        "offered": len(load) + unanswered,
        "seconds": seconds,
        "sent_seconds": stop - start,
        "started_at": start,  # CLOCK_MONOTONIC: the same clock in every process here
        "counts": counts,
        "good": int(good.sum()),
        "good_in_run": good_in_run,
        "goodput": good_in_run / seconds,
        "ok_p50_ms": pct(status == 200, 50),
        "ok_p99_ms": pct(status == 200, 99),
        "shed_p50_ms": pct(shed, 50),
        "shed_p99_ms": pct(shed, 99),
        # of those latencies, how late this client sent (its own loop behind, or no free
        # connection): the rest is the server's (socket buffers included) and the reading here
        "ok_sent_late_p99_ms": late_pct(status == 200, 99),
        "shed_sent_late_p50_ms": late_pct(shed, 50),
        "shed_sent_late_p99_ms": late_pct(shed, 99),
        "shed_after_send_p99_ms": (
            float(np.percentile((latency - late)[shed], 99) * 1000) if shed.any() else None
        ),
        "shed_without_retry_after": int(sum(1 for r in load if r[2] == 429 and not r[3])),
        "good_per_second": [int(x) for x in per_second],
        "max_connections_open": gen.max_open,
        "max_waiting_for_a_connection": gen.max_waiting,
        "probes": probes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.openloop")
    parser.add_argument("--url", required=True)
    parser.add_argument("--body-file", required=True)
    parser.add_argument("--rate", type=float, required=True, help="requests per second")
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--deadline-ms", type=float, default=5000.0)
    parser.add_argument("--connections", type=int, default=256, help="opened before the run")
    parser.add_argument("--max-conns", type=int, default=1000, help="opened as needed, at most")
    parser.add_argument("--probe-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    body = loopback_body(parser, args.url, args.body_file)
    return run_and_print(
        run(args.url, body, args.rate, args.duration, args.deadline_ms / 1000.0, args.max_conns,
            args.probe_s, args.connections)
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
