"""Client load from a separate process: ``wrk`` (Debian's package) when installed, else our own.

Both are closed-loop: N connections, each sending its next request when the previous answer
came back, for a bounded time (and, optionally, a bounded number of answers), to 127.0.0.1
only. One run gives requests/s, p50 and p99 latency and the errors seen. Every side of a
comparison gets the same client, body, connection count and duration.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.harness import REPO
from bench.procs import QUIET_ENV

_WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = [==[{body}]==]
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{{"client":"wrk","requests":%d,"seconds":%f,"non_200":%d,"socket_errors":%d,' ..
    '"p50_ms":%f,"p90_ms":%f,"p99_ms":%f,"max_ms":%f}}\\n',
    summary.requests, summary.duration / 1e6, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50) / 1e3, latency:percentile(90) / 1e3, latency:percentile(99) / 1e3,
    latency.max / 1e3))
end
"""


@dataclass(frozen=True, slots=True)
class LoadResult:
    """One load run as the client saw it."""

    client: str
    clients: int
    requests: int
    seconds: float
    non_200: int
    socket_errors: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def ok_rps(self) -> float:
        """200s per second (``errors`` counts the rest)."""
        return (self.requests - self.non_200) / self.seconds if self.seconds > 0 else 0.0

    @property
    def errors(self) -> int:
        return self.non_200 + self.socket_errors

    def to_json(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "clients": self.clients,
            "requests": self.requests,
            "seconds": self.seconds,
            "rps": self.rps,
            "non_200": self.non_200,
            "socket_errors": self.socket_errors,
            "p50_ms": self.p50_ms,
            "p90_ms": self.p90_ms,
            "p99_ms": self.p99_ms,
            "max_ms": self.max_ms,
        }


def pick_client(preference: str) -> str:
    """``wrk`` when asked for or (``auto``) when it is on PATH, else ``python``."""
    if preference == "python":
        return "python"
    if shutil.which("wrk"):
        return "wrk"
    if preference == "wrk":
        raise RuntimeError("wrk is not on PATH (apt-get install wrk), use --load-client python")
    return "python"


def describe_client(client: str) -> str:
    if client == "wrk":
        return "wrk 4 (1 thread, closed loop, keep-alive), a separate process"
    return (
        "bench.loadgen (asyncio + uvloop raw HTTP/1.1, closed loop, keep-alive), a separate process"
    )


def _loadgen_argv(
    url: str, body: bytes, clients: int, duration_s: float, workdir: Path, max_requests: int
) -> list[str]:
    """``python -m bench.loadgen`` with the body in a file of ``workdir``."""
    body_file = workdir / "body.json"
    body_file.write_bytes(body)
    return [
        sys.executable, "-m", "bench.loadgen", "--url", url, "--body-file", str(body_file),
        "--clients", str(clients), "--duration", str(duration_s),
        "--max-requests", str(max_requests),
    ]  # fmt: skip


def run_load(
    client: str,
    url: str,
    body: bytes,
    clients: int,
    duration_s: float,
    workdir: Path,
    max_requests: int = 0,
) -> LoadResult:
    """Drive ``url`` with ``clients`` connections for ``duration_s`` (and ``max_requests``).

    A run bounded by ``max_requests`` always uses ``bench.loadgen``: wrk's threads can stop
    early, but wrk itself still sleeps out the whole duration, which would skew requests/s.
    """
    if urlsplit(url).hostname not in ("127.0.0.1", "localhost"):
        raise ValueError(f"load is only ever sent to 127.0.0.1, not {url}")
    workdir.mkdir(parents=True, exist_ok=True)
    if client == "wrk" and not max_requests:
        argv = _wrk_argv(url, body, clients, duration_s, workdir)
    else:
        argv = _loadgen_argv(url, body, clients, duration_s, workdir, max_requests)
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=duration_s + 60,
        cwd=REPO,
        env={**_env(), **QUIET_ENV},
    )
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("{")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"load client failed ({done.returncode}): {done.stdout}{done.stderr}")
    data = json.loads(line)
    return LoadResult(
        client=data["client"],
        clients=clients,
        requests=int(data["requests"]),
        seconds=float(data["seconds"]),
        non_200=int(data["non_200"]),
        socket_errors=int(data["socket_errors"]),
        p50_ms=float(data["p50_ms"]),
        p90_ms=float(data["p90_ms"]),
        p99_ms=float(data["p99_ms"]),
        max_ms=float(data["max_ms"]),
    )


def _wrk_argv(url: str, body: bytes, clients: int, duration_s: float, workdir: Path) -> list[str]:
    text = body.decode()
    if "]==]" in text:
        raise ValueError("request body cannot be embedded in the wrk script")
    script = workdir / "wrk.lua"
    script.write_text(_WRK_SCRIPT.format(body=text))
    seconds = max(1, math.ceil(duration_s))
    return [
        "wrk",
        "-t1",
        f"-c{clients}",
        f"-d{seconds}s",
        "--timeout",
        "10s",
        "-s",
        str(script),
        url,
    ]


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)
