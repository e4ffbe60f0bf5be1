"""Delayed labels: predict now, learn when the outcome is known.

This package owns the whole way of a delayed label (README "Delayed labels"):

- ``ids``: validation of the per-row ids a prediction request may carry.
- ``wire``: the payloads: label messages (``livefit/<name>/labels``, JSON or msgpack) and
  prediction records (``livefit/<name>/predictions``, msgpack), decoded and validated into
  ``LabelBatch`` and ``PredictionBatch``; anything hostile is a ``codec.Rejection``.
- ``recorder``: the serving side (learner and replicas): prediction records published at QoS 1
  from a bounded buffer, never blocking a prediction; labels posted over HTTP forwarded.
- ``store``: the join itself, deterministic and thread-free: pending predictions, early labels,
  expiry by TTL and by count, served score. Pure state driven by events in log order.
- ``joiner``: the learner's narrow interface to ingestion: decode an MQTT message into an event,
  its write-ahead-log record, apply it after the log write, expiry ticks, checkpoint state and
  replay.
- ``http``: ``POST /v1/models/<name>/labels``.

It may import ``codec``, ``samples``, ``metrics``, ``config`` and ``mqtt``; ingestion, the
runtimes and the prediction API import it, never the other way round.
"""
