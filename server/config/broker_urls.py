"""Broker URLs: ``mqtt[s]://`` URLs parsed into ``BrokerAddress`` es, one per node of a cluster
(``parse_broker_urls``). The settings validate ``broker.url`` with it when the file loads, so a
malformed URL, the same node twice or different users stop a process before it starts;
every MQTT client of livefit and the clients use the same parse
(``as_nodes`` turns one address or several into the nodes to try).

Several nodes: ``broker.url`` is a TOML list of URLs or one string of URLs separated by commas
(what an environment variable can carry). All speak the same scheme (``mqtt`` or ``mqtts``:
one TLS setting serves them all), and share one user: credentials may be written on any of the
URLs, and URLs that carry them must carry the same ones (a cluster has one user database).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

MAX_BROKER_URLS = 64  # broker.url: nodes of one cluster; more is a mistake, not a cluster
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
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{user}{host}:{self.port}"

    @property
    def node(self) -> str:
        """``host:port``: the node's name in logs and metric labels (no user, no password)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_broker_url(url: str) -> BrokerAddress:
    """Parse one broker URL; ValueError names what is wrong (never the password)."""
    shown = hide_credentials(url)
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # "Invalid IPv6 URL": an unclosed [
        raise ValueError(f"broker URL {shown!r}: {exc}") from None
    if parts.scheme not in ("mqtt", "mqtts"):
        raise ValueError(f"broker URL must start with mqtt:// or mqtts://, got {shown!r}")
    if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"broker URL must look like mqtt://[user:pass@]host:port, got {shown!r}")
    tls = parts.scheme == "mqtts"
    port_text = parts.netloc.rpartition("@")[2].rpartition("]")[2].partition(":")[2]
    if port_text and not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"broker URL has an invalid port: {shown!r}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"broker URL has an invalid port: {shown!r}") from None
    if port == 0:  # not "no port": 0 is no broker's port, and must not become 1883
        raise ValueError(f"broker URL has port 0, which no broker listens on: {shown!r}")
    if port is None:
        port = DEFAULT_TLS_PORT if tls else DEFAULT_PORT
    return BrokerAddress(
        host=parts.hostname,
        port=port,
        tls=tls,
        username=unquote(parts.username) if parts.username is not None else None,
        password=unquote(parts.password) if parts.password is not None else None,
    )


def parse_broker_urls(value: str | Sequence[str]) -> tuple[BrokerAddress, ...]:
    """The nodes ``value`` names, in order: one URL, URLs separated by commas, or a list of
    URLs. ValueError names what is wrong: no URL, too many, one malformed, mixed schemes, the
    same node twice, different users."""
    nodes = tuple(parse_broker_url(url) for url in broker_url_list(value))
    if len({node.tls for node in nodes}) > 1:
        raise ValueError("broker URLs mix mqtt:// and mqtts://: every node must use the same one")
    seen: set[tuple[str, int]] = set()
    for node in nodes:
        if (node.host, node.port) in seen:
            raise ValueError(f"broker URLs name {node.node} twice")
        seen.add((node.host, node.port))
    users = {(n.username, n.password) for n in nodes if n.username is not None}
    if len(users) > 1:
        raise ValueError(
            "broker URLs carry different users or passwords: a cluster has one user, write it "
            "on one URL (or the same on each)"
        )
    if users:
        username, password = users.pop()
        nodes = tuple(dataclasses.replace(n, username=username, password=password) for n in nodes)
    return nodes


def broker_url_list(value: str | Sequence[str]) -> list[str]:
    """``broker.url`` as a list of URLs: a list as it is, a string split at its commas, blanks
    around each stripped; ValueError for none, an empty one, or more than ``MAX_BROKER_URLS``."""
    urls = [u.strip() for u in (value.split(",") if isinstance(value, str) else value)]
    if not urls or not all(isinstance(u, str) and u for u in urls):
        raise ValueError("no broker URL, or an empty one in the list (a stray comma?)")
    if isinstance(value, str) and "@" in value and not all("://" in u for u in urls):
        # A comma in a password splits its URL: neither piece may be shown.
        raise ValueError(
            "a piece between commas is no URL: a comma inside a password? Percent-encode it "
            "(%2C), as any of : / @ # ? % in a password"
        )
    if len(urls) > MAX_BROKER_URLS:
        raise ValueError(
            f"{len(urls)} broker URLs: at most {MAX_BROKER_URLS} (the nodes of one cluster)"
        )
    return urls


def hide_credentials(url: str) -> str:
    """``url`` as a log line or an error may show it: the user and password replaced, everything
    from ``//`` to the last ``@`` (a password may hold a ``/``, ``#`` or ``@`` that a URL would
    need percent-encoded: the error about it must not show it). In a string of several URLs
    that hides the nodes before the last ``@`` too: more hidden, never a password shown."""
    return re.sub(r"//.*@", "//***@", url, flags=re.DOTALL)


def as_nodes(address: BrokerAddress | Sequence[BrokerAddress]) -> tuple[BrokerAddress, ...]:
    """One broker or a cluster's nodes, as the nodes (at least one)."""
    nodes = (address,) if isinstance(address, BrokerAddress) else tuple(address)
    if not nodes:
        raise ValueError("no broker node")
    return nodes
