"""The livefit server, one package per responsibility, imports flowing one way (bottom first;
``tests/unit/repo/test_layers.py`` holds the list and fails on an upward import or a cycle):

- ``base``: generic parts that know nothing of livefit's data (logging, a newest-wins worker
  thread, liveness files, the metrics registry and its merge across processes).
- ``wire`` and ``config``: the formats (sample and label messages, snapshots) and the settings.
- ``mqtt`` and ``storage``: the one paho client wrapper; what survives a restart on disk (the
  write-ahead log, checkpoints, the storage lock and health).
- ``labels``: the delayed-label join and the serving side's prediction recorder.
- ``ingest``: MQTT messages in, decoded, logged, acknowledged, queued for training.
- ``train``: sample queues into trainers, trainers into snapshots.
- ``weights``: snapshots into the signed weight stream, and its receivers.
- ``serve``: snapshots into batched predictions.
- ``http``: the FastAPI app over ``serve``, ``labels`` and ``weights``.
- ``runtime``: the processes wired together (learner, replica, groups); nothing imports it but
  the commands in ``livefit/``.

A sample travels ``mqtt -> ingest -> train``, a snapshot ``train -> weights | serve``, a
request ``http -> serve``.
"""
