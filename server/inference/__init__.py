"""Predictions from the newest weights: the request batcher with admission by expected wait
(``batcher``) and the served model that swaps in snapshots (``serving``).

Imports: ``snapshot``, ``labels`` (prediction records), ``config``, ``metrics``. No HTTP: the
``api`` package calls in.
"""
