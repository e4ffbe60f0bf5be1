"""A sample's way in: MQTT messages decoded, deduplicated, appended to the write-ahead log,
acknowledged and queued for training (``worker``: the ingest worker; ``group_commit``: the
group of messages it holds, logged with one fsync; ``route``: where a topic's messages go;
``dedup``: sequence numbers already seen; ``sample_queue``: the bounded queue per model,
backpressure).

Imports ``wire``, ``mqtt``, ``storage``, ``labels`` (label messages share the session),
``config`` and ``base``. Nothing here trains or serves.
"""
