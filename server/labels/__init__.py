"""Delayed labels: predict now, learn when the outcome is known (README "Delayed labels").

- ``store``: the join itself, deterministic and thread-free: pending predictions, early labels,
  expiry by TTL and by count. Pure state driven by events in log order.
- ``score``: what the answered predictions got right, by version.
- ``joiner``: the learner's narrow interface to ingestion: decode an MQTT message into an event,
  its write-ahead-log record, apply it after the log write, expiry ticks, checkpoint state and
  replay.
- ``recorder``: the serving side (learner and replicas): prediction records published at QoS 1
  from a bounded buffer, never blocking a prediction; labels posted over HTTP forwarded.

The payloads are ``wire.labels`` and ``wire.label_ids``; the HTTP route is
``http.labels_api``. Imports ``wire``, ``config``, ``mqtt``, ``storage`` (log records) and
``base``; ``ingest``, ``serve``, ``http`` and ``runtime`` import it.
"""
