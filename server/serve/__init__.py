"""Predictions from the newest weights: the request batcher (``batcher``: the queue and the
model calls), admission by expected wait (``admission``), the batch cost model and the "auto"
timeout (``batch_cost``), what goes through the batcher (``batch_types``), a model's serving
copy that swaps in snapshots (``serving``), the past versions it keeps for the versioned
paths (``versions``), its endpoint, what the HTTP API reaches by the model's name
(``endpoint``), and the busy board that tells a trainer in another process that
predictions wait (``busy_board``).

Imports ``labels`` (prediction records), ``storage`` (checkpoints read as past versions),
``wire`` (snapshots), ``config`` and ``base``. No HTTP: ``http`` calls in.
"""
