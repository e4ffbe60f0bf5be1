"""Predictions from the newest weights: the request batcher with admission by expected wait
(``batcher``), the served model that swaps in snapshots (``serving``) and the busy board
that tells a trainer in another process that predictions wait (``busy_board``).

Imports: ``snapshot``, ``labels`` (prediction records), ``config``, ``metrics``. No HTTP: the
``api`` package calls in.
"""
