"""Generic building blocks that know nothing of livefit's data: logging setup (``logs``), a
newest-wins worker thread (``latest_worker``), when to try a failing thing again
(``backoff``), a compiled call over flat arguments (``flat_call``), liveness files
(``heartbeat``), the metrics registry (``metrics``), the merge of several processes' metrics
into one exposition (``metrics_merge``), time that a wall-clock step cannot bend
(``clocks``), and TensorFlow's quiet import and quick exit (``tensorflow_start``).

Imports nothing of livefit: every other package may import it.
"""
