"""The weight stream: the signed envelope (``weight_format``), keys and their discovery
(``weight_keys``), the learner's publisher (``weight_publisher``) and the replica's receiver
(``weight_receiver``).

Imports: ``messaging``, ``snapshot``, ``latest_worker``, ``config``, ``metrics``.
"""
