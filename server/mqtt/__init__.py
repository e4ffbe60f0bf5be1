"""MQTT and the sample wire format: the one paho client wrapper every MQTT user in livefit
goes through (``mqtt``; its parts: the paho client's settings ``paho_client``, connection
failures ``connection_status``, one-off probes ``probe``), broker addresses and the brokers
``serve`` may start (``broker``), and the decoder of sample messages (``codec``; its fields
``codec_fields``, shared with the labels' wire format; what decoders raise, ``rejection``; the
encoding both sides share is ``livefit.wire``).

Imports: ``config``, ``metrics``, ``ingestion.samples`` (what ``codec`` decodes into) and
``processes.children`` (a broker started as a child).
"""
