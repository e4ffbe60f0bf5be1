"""The one paho wrapper every MQTT user in livefit goes through (``connection``:
``MqttConnection``; the paho client's settings ``paho_client``; connection failures
``connection_status``; one-off probes ``probe``), broker addresses (``broker``: URL parsing;
finding or starting a broker for ``url = "auto"`` is ``runtime.broker``'s) and the guard that
keeps every PUBLISH under the broker's packet limit (``publish_guard``).

Imports ``config`` and ``base``.
"""
