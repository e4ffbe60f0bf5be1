"""A sample's way in: MQTT messages decoded, deduplicated, appended to the write-ahead log,
acknowledged and queued for training (``ingest``, its group commit ``group_commit``, ``route``,
``samples``, ``dedup``, ``wal``).

Imports: ``messaging``, ``storage``, ``labels`` (label messages share the session), ``config``,
``metrics``. Nothing here trains or serves.
"""
