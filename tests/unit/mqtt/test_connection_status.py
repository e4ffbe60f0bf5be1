"""What readiness says about the broker connection (``mqtt.connection_status``)."""

from __future__ import annotations

from livefit.server.config.broker_urls import BrokerAddress
from livefit.server.config.sections import BrokerSettings
from livefit.server.mqtt.connection_status import ConnectionStatus


def nodes(n: int) -> list[BrokerAddress]:
    return [BrokerAddress("127.0.0.1", 2000 + i) for i in range(n)]


def test_readiness_names_every_node_once_each_has_failed() -> None:
    """Before, with every node down, readiness named the first node alone with the count of
    the attempts on all of them: 'MQTT broker at mqtt://n0 unreachable (6 ... failed)'."""
    three = nodes(3)
    status = ConnectionStatus(three[0], "learner-demo", BrokerSettings(), nodes=three)
    status.failed()
    assert str(three[0]) in status.reason() and "every node" not in status.reason()
    status.failed()
    status.failed()
    reason = status.reason()
    assert "every node" in reason and all(str(node) in reason for node in three), reason
    status.succeeded()
    alone = ConnectionStatus(three[0], "learner-demo", BrokerSettings())
    for _ in range(5):
        alone.failed()
    assert "every node" not in alone.reason() and str(three[0]) in alone.reason()
