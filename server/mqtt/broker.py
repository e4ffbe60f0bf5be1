"""Where the broker is: ``mqtt[s]://`` URLs parsed into a ``BrokerAddress``. Resolving
``url = "auto"`` (finding or starting a broker) is ``runtime.broker``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 1883
DEFAULT_TLS_PORT = 8883


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """A broker endpoint, parsed from ``mqtt[s]://[user:pass@]host[:port]``."""

    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = None

    def __str__(self) -> str:  # never shows the password
        scheme = "mqtts" if self.tls else "mqtt"
        user = f"{self.username}@" if self.username else ""
        return f"{scheme}://{user}{self.host}:{self.port}"


def parse_broker_url(url: str) -> BrokerAddress:
    """Parse a broker URL; ValueError names what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in ("mqtt", "mqtts"):
        raise ValueError(f"broker URL must start with mqtt:// or mqtts://, got {url!r}")
    if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"broker URL must look like mqtt://[user:pass@]host:port, got {url!r}")
    tls = parts.scheme == "mqtts"
    try:
        port = parts.port or (DEFAULT_TLS_PORT if tls else DEFAULT_PORT)
    except ValueError:
        raise ValueError(f"broker URL has an invalid port: {url!r}") from None
    return BrokerAddress(
        host=parts.hostname,
        port=port,
        tls=tls,
        username=unquote(parts.username) if parts.username is not None else None,
        password=unquote(parts.password) if parts.password is not None else None,
    )
