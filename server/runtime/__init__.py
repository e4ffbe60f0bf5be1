"""Processes, wired: the learner's runtime (``learner``: its models built and wired, the start
and stop order; its write-ahead log replayed and truncated in ``learner_log``) and
the replica's (``replica``), their common part (``process_runtime``), uvicorn in front
(``http_server``; the socket it binds first, ``listening``; stop signals ``stop_signals``), replica
worker groups (``workers``, ``group_directory``), the split learner (``learner_group``
supervising ``training_process`` and ``learner_serving``), child processes that die with their
parent (``children``), and the broker ``broker.url = "auto"`` finds or starts (``broker``, with
``mosquitto`` and the child-process toolkit ``local_process`` it runs on).

Imports every other server package; nothing in ``server`` or ``clients`` imports it, only the
commands (``livefit.cli``, ``livefit.demo``), ``livefit.local_servers``, the tests and the bench.
"""
