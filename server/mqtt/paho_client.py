"""The paho client every MQTT user in livefit builds (``paho_client``): protocol, reconnect
back-off, TLS and credentials from the broker settings, applied in one place."""

from __future__ import annotations

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from ..config.broker_urls import BrokerAddress
from ..config.sections import BrokerSettings, TlsSettings


def apply_credentials(client: paho.Client, address: BrokerAddress, tls: TlsSettings) -> None:
    """Username/password from the URL, and TLS (CA, client certificate) for ``mqtts://``."""
    if address.username:
        client.username_pw_set(address.username, address.password)
    if address.tls:
        client.tls_set(ca_certs=tls.ca_file, certfile=tls.cert_file, keyfile=tls.key_file)
        client.tls_insecure_set(tls.insecure)


def paho_client(
    client_id: str,
    address: BrokerAddress,
    settings: BrokerSettings,
    *,
    protocol: str | None = None,
    persistent: bool,
    manual_ack: bool = False,
) -> paho.Client:
    """A paho client with every broker setting applied: protocol, reconnect back-off, TLS and
    credentials. ``persistent``: the broker keeps the session across disconnects (MQTT 3.1.1
    clean_session false; MQTT 5 sets clean_start and the expiry at connect)."""
    v5 = (protocol or settings.protocol) == "5"
    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
        clean_session=None if v5 else not persistent,
        manual_ack=manual_ack,
        reconnect_on_failure=True,
    )
    client.suppress_exceptions = True
    client.reconnect_delay_set(
        min_delay=max(1, round(settings.reconnect_min_s)),
        max_delay=max(1, round(settings.reconnect_max_s)),
    )
    apply_credentials(client, address, settings.tls)
    return client
