"""The weight stream: the signed envelope (``weight_format``), keys and their discovery
(``weight_keys``), the learner's publisher (``weight_publisher``), the verification every
receiver runs (``weight_verifier``), the MQTT receiver of replicas and clients
(``weight_receiver``) and a split learner's local feed to its serving processes
(``local_feed``).

Imports: ``messaging``, ``snapshot``, ``latest_worker``, ``config``, ``metrics``.
"""
