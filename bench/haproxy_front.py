"""HAProxy in front of one livefit server, as users deploy it anyway: a bounded queue per
server (``maxconn``) and a fast 429 with ``Retry-After`` from the proxy, so the server's event
loop sees only what it can answer. The overload benchmark's ``haproxy`` side.

``haproxy_front(upstream_port, workdir)`` writes the configuration, starts ``haproxy`` (Debian's
package; None when it is not installed) in the foreground and stops it on exit.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from livefit.local_servers import HttpProcess
from livefit.server.runtime.local_process import LOOPBACK, free_port

SERVER_MAXCONN = 64  # requests in flight at the server: the capacity run's concurrency
QUEUE_TIMEOUT_MS = 1000  # a request waits this long for a slot at most, then gets 429
QUEUE_REFUSE_AT = 512  # requests already queued at the proxy: refuse at once beyond
REFUSAL_BODY = '{"error": "the server is overloaded; retry later"}'
REFUSE_RULE = (
    f"http-request return status 429 content-type application/json string '{REFUSAL_BODY}' "
    f"hdr retry-after 1 if {{ queue(livefit) gt {QUEUE_REFUSE_AT} }}"
)

CONFIG = """\
global
    maxconn 8192
    nbthread 1

defaults
    mode http
    option http-keep-alive
    option http-no-delay
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 30s
    # a request that waited timeout queue for a slot at the server gets 429, not 503
    timeout queue {queue_timeout_ms}ms
    errorfile 503 {refusal_file}

frontend predict
    bind {host}:{port}
    {refuse_rule}
    default_backend livefit

backend livefit
    http-reuse always
    option httpchk GET /v2/health/ready
    server learner {host}:{upstream} maxconn {maxconn} check inter 1s
"""


def refusal_file_text() -> str:
    """The raw HTTP answer HAProxy sends for a queue timeout (its own 503): a 429."""
    return (
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
        f"content-length: {len(REFUSAL_BODY)}\r\nretry-after: 1\r\ncache-control: no-cache\r\n"
        f"connection: keep-alive\r\n\r\n{REFUSAL_BODY}"
    )


def available() -> bool:
    return shutil.which("haproxy") is not None


@contextlib.contextmanager
def haproxy_front(upstream_port: int, workdir: Path) -> Iterator[HttpProcess]:
    """HAProxy on a free loopback port in front of ``upstream_port``, ready (its readiness
    route answered 200 through the proxy); stopped on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    refusal = workdir / "429.http"
    refusal.write_text(refusal_file_text())
    port = free_port()
    config = workdir / "haproxy.cfg"
    config.write_text(
        CONFIG.format(
            host=LOOPBACK, port=port, upstream=upstream_port, maxconn=SERVER_MAXCONN,
            queue_timeout_ms=QUEUE_TIMEOUT_MS, refuse_rule=REFUSE_RULE, refusal_file=refusal,
        )
    )  # fmt: skip
    argv = ["haproxy", "-db", "-f", str(config)]
    with HttpProcess("haproxy", argv, workdir / "haproxy.log", port) as front:
        front.start(30.0)
        yield front
