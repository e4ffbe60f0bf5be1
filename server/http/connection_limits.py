"""The limits of one server's HTTP connections (``http.*`` settings, the connection cap fitted
to the process's descriptor limit), the reasons a connection is closed on the server's own
initiative, and the whole response sent before such a close. Used by ``connections``."""

from __future__ import annotations

import json
import logging
import resource
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config.sections import HttpSettings

log = logging.getLogger(__name__)

FD_RESERVE = 128  # descriptors kept for everything else (broker, log, checkpoints, TensorFlow)
CLOSE_REASONS = (
    "header_timeout", "idle", "evicted", "refused", "header_too_large", "body_timeout",
)  # fmt: skip


def close_response(status: int, reason: str, message: str, extra: str = "") -> bytes:
    """A whole HTTP/1.1 response with a JSON error body and ``connection: close``."""
    body = json.dumps({"error": message}).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n"
    ).encode() + body


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout_s: float
    keep_alive_timeout_s: float
    max_connections: int
    max_header_bytes: int
    body_timeout_s: float = 10.0

    @classmethod
    def from_settings(cls, http: HttpSettings) -> ConnectionLimits:
        return cls(
            http.header_timeout_s,
            http.keep_alive_timeout_s,
            effective_max_connections(http.max_connections),
            http.max_header_bytes,
            http.body_timeout_s,
        )


def effective_max_connections(wanted: int) -> int:
    """``wanted``, lowered (with a warning) to leave ``FD_RESERVE`` descriptors of the soft
    RLIMIT_NOFILE for the rest of the process."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or wanted <= soft - FD_RESERVE:
        return wanted
    fitted = max(16, soft - FD_RESERVE)
    log.warning(
        "http.max_connections=%d does not fit the open-file limit of %d (ulimit -n); using %d "
        "(raise the limit, e.g. LimitNOFILE= or docker --ulimit nofile=, for more)",
        wanted, soft, fitted,
    )  # fmt: skip
    return fitted
