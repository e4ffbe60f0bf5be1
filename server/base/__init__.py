"""Generic building blocks that know nothing of livefit's data: logging setup (``logs``), a
newest-wins worker thread (``latest_worker``), when to try a failing thing again
(``backoff``), a compiled call over flat arguments (``flat_call``), liveness files
(``heartbeat``), the metrics registry (``metrics``) and the merge of several processes'
metrics into one exposition (``metrics_merge``).

Imports nothing of livefit: every other package may import it.
"""
