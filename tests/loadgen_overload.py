"""Load generator for the overload test: N asyncio clients for S seconds against one learner
(``loadgen_overload.py URL N S [PATH]``; PATH defaults to the unversioned predict path).

Prints JSON: counts by status, latency percentiles of 200s and 429s (ms), requests/s.
Runs as its own process so that the load does not share the test's event loop. aiohttp, not
httpx: httpx's connection pool degrades badly past a few dozen concurrent connections (measured
here against a constant FastAPI endpoint: 542 req/s at 8 clients, 95 req/s at 64).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import aiohttp
import numpy as np

BODY = {"instances": np.zeros((1, 16, 4)).tolist()}


async def main(
    url: str, clients: int, seconds: float, path: str = "/v1/models/demo:predict"
) -> dict[str, float]:
    counts = {"status_200": 0, "status_429": 0, "other": 0, "errors": 0, "retry_after_missing": 0}
    ok: list[float] = []
    shed: list[float] = []
    end = time.monotonic() + seconds
    body = json.dumps(BODY).encode()
    headers = {"Content-Type": "application/json"}

    async def client(http: aiohttp.ClientSession) -> None:
        while time.monotonic() < end:
            started = time.perf_counter()
            try:
                async with http.post(f"{url}{path}", data=body, headers=headers) as response:
                    await response.read()
                    status, retry_after = response.status, response.headers.get("Retry-After")
            except (aiohttp.ClientError, TimeoutError):
                counts["errors"] += 1
                continue
            elapsed = (time.perf_counter() - started) * 1000
            if status == 200:
                counts["status_200"] += 1
                ok.append(elapsed)
            elif status == 429:
                counts["status_429"] += 1
                shed.append(elapsed)
                counts["retry_after_missing"] += retry_after is None
            else:
                counts["other"] += 1

    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    figures: dict[str, float] = dict(counts)
    figures["requests_per_s"] = (counts["status_200"] + counts["status_429"]) / seconds
    for name, values in (("ok", ok), ("shed", shed)):
        if values:
            p50, p99 = np.percentile(values, [50, 99])
            figures[f"{name}_p50_ms"], figures[f"{name}_p99_ms"] = float(p50), float(p99)
    return figures


if __name__ == "__main__":
    path = sys.argv[4] if len(sys.argv) > 4 else "/v1/models/demo:predict"
    print(json.dumps(asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), path))))
