"""Predictions from the newest weights: the request batcher (``batcher``: the queue and the
model calls; it re-exports the names of ``admission``, admission by expected wait,
``batch_cost``, the batch cost model and the "auto" timeout, and ``batch_types``, what goes
through it), the served model that swaps in snapshots (``serving``) and the busy board that
tells a trainer in another process that predictions wait (``busy_board``).

Imports: ``snapshot``, ``labels`` (prediction records), ``config``, ``metrics``. No HTTP: the
``api`` package calls in.
"""
