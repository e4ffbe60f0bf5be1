"""Wiring and lifecycle: the learner's runtime (``runtime``: the start and stop order; its
models built in ``learner_models``, its write-ahead log replayed and truncated in
``learner_log``) and the replica's (``replica``), their common part (``process_runtime``),
uvicorn in front (``serve``; the socket it binds first, ``listening``), replica worker groups
(``workers``), the split learner (``learner_group`` supervising ``training_process`` and
``learner_serving``), child processes that die with their parent (``children``) and the
toolkit that starts mosquitto and livefit processes for the demo, the bench and the tests
(``local_processes``, gathering ``local_process``, ``local_mosquitto`` and ``local_servers``).

Imports: every other package (this is where they are put together); nothing imports it but
``livefit.cli``, the demo, the clients that start processes, and ``messaging.broker``
(``children``).
"""
