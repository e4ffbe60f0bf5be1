"""A closed-loop HTTP/1.1 load client in its own process, for when ``wrk`` is not installed.

``python -m bench.loadgen --url URL --body-file F --clients N --duration S [--max-requests M]``
keeps N keep-alive connections to 127.0.0.1, each sending the next POST as soon as the previous
answer arrived, stops after S seconds or M answers, and prints one JSON line: answers, seconds,
non-200 answers, socket errors and latency percentiles. It speaks just enough HTTP (Content-Length
or chunked bodies) over raw asyncio streams: httpx costs several times more CPU per request,
and on a small machine the client would then be what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Coroutine
from typing import Any
from urllib.parse import urlsplit

import numpy as np


class _Stats:
    def __init__(self, max_requests: int) -> None:
        self.latencies_ns: list[int] = []
        self.non_200 = 0
        self.socket_errors = 0
        self.max_requests = max_requests
        self.stop = asyncio.Event()

    def record(self, latency_ns: int, status: int) -> None:
        self.latencies_ns.append(latency_ns)
        if status != 200:
            self.non_200 += 1
        if self.max_requests and len(self.latencies_ns) >= self.max_requests:
            self.stop.set()


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length, chunked = 0, False
    for line in lines[1:]:
        key, _, value = line.partition(b":")
        key = key.strip().lower()
        if key == b"content-length":
            length = int(value)
        elif key == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif length:
        await reader.readexactly(length)
    return status


async def _client(host: str, port: int, request: bytes, stats: _Stats, until: float) -> None:
    while not stats.stop.is_set() and time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            stats.socket_errors += 1
            await asyncio.sleep(0.05)
            continue
        try:
            while not stats.stop.is_set() and time.monotonic() < until:
                started = time.perf_counter_ns()
                writer.write(request)
                status = await _read_response(reader)
                stats.record(time.perf_counter_ns() - started, status)
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            stats.socket_errors += 1
        finally:
            writer.close()


def post_request(url: str, body: bytes) -> tuple[str, int, bytes]:
    """(host, port, the raw bytes of one keep-alive JSON POST of ``body`` to ``url``)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    return host, port, request


def loopback_body(parser: argparse.ArgumentParser, url: str, body_file: str) -> bytes:
    """The request body, once ``url`` is known to be on this machine (load goes nowhere else)."""
    if urlsplit(url).hostname not in ("127.0.0.1", "localhost", "::1"):
        parser.error("load is only ever sent to this machine (127.0.0.1)")
    with open(body_file, "rb") as handle:
        return handle.read()


def run_and_print(load: Coroutine[Any, Any, dict]) -> int:
    """Run ``load`` on uvloop (the loop uvicorn uses on the server side) when installed,
    print its result as one JSON line for the parent process."""
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(load)
    else:
        result = uvloop.run(load)
    print(json.dumps(result), flush=True)
    return 0


async def run(url: str, body: bytes, clients: int, duration_s: float, max_requests: int) -> dict:
    host, port, request = post_request(url, body)
    stats = _Stats(max_requests)
    started = time.monotonic()
    until = started + duration_s
    tasks = [
        asyncio.create_task(_client(host, port, request, stats, until)) for _ in range(clients)
    ]
    _, pending = await asyncio.wait(tasks, timeout=duration_s + 30)
    for task in pending:
        task.cancel()
    seconds = time.monotonic() - started
    lat = np.asarray(stats.latencies_ns, dtype=np.float64) / 1e6
    pct = (lambda q: float(np.percentile(lat, q))) if lat.size else (lambda q: float("nan"))
    return {
        "client": "python",
        "requests": int(lat.size),
        "seconds": seconds,
        "non_200": stats.non_200,
        "socket_errors": stats.socket_errors,
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p99_ms": pct(99),
        "max_ms": float(lat.max()) if lat.size else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen")
    parser.add_argument("--url", required=True)
    parser.add_argument("--body-file", required=True)
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--max-requests", type=int, default=0)
    args = parser.parse_args(argv)
    body = loopback_body(parser, args.url, args.body_file)
    return run_and_print(run(args.url, body, args.clients, args.duration, args.max_requests))


if __name__ == "__main__":
    sys.exit(main())
