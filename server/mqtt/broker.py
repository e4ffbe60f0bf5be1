"""Where the broker is: one ``BrokerAddress`` per node of a cluster. The URLs are parsed by
``config.broker_urls`` (the settings validate ``broker.url`` with it when the file loads), whose
names are re-exported here for the clients; resolving ``url = "auto"`` (finding or starting a
broker) is ``runtime.broker``'s; which node to try next is ``failover``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

# The parse lives with the settings, which validate broker.url by it; re-exported for clients.
from ..config.broker_urls import DEFAULT_HOST as DEFAULT_HOST
from ..config.broker_urls import DEFAULT_PORT as DEFAULT_PORT
from ..config.broker_urls import DEFAULT_TLS_PORT as DEFAULT_TLS_PORT
from ..config.broker_urls import BrokerAddress as BrokerAddress
from ..config.broker_urls import parse_broker_url as parse_broker_url
from ..config.broker_urls import parse_broker_urls as parse_broker_urls


def as_nodes(address: BrokerAddress | Sequence[BrokerAddress]) -> tuple[BrokerAddress, ...]:
    """One broker or a cluster's nodes, as the nodes (at least one)."""
    nodes = (address,) if isinstance(address, BrokerAddress) else tuple(address)
    if not nodes:
        raise ValueError("no broker node")
    return nodes
