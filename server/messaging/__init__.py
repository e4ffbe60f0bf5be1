"""MQTT and the sample wire format: the one paho client wrapper every MQTT user in livefit
goes through (``mqtt``), broker addresses and the brokers ``serve`` may start (``broker``), and
the decoder of sample messages (``codec``; the encoding both sides share is ``livefit.wire``).

Imports: ``config``, ``metrics``, ``ingestion.samples`` (what ``codec`` decodes into) and
``processes.children`` (a broker started as a child).
"""
