"""The weight stream: the signed envelope (``weight_format``), keys and their discovery
(``weight_keys``), a receiver's verification policy (``receiver_auth``), the learner's
publisher (``weight_publisher``; what it keeps for HTTP pulls, ``weight_store``; its log lines
about versions, ``version_log``), the verification every receiver runs (``weight_verifier``),
the MQTT receiver of replicas and clients (``weight_receiver``) and a split learner's local
feed to its serving processes (``local_feed``).

Imports: ``messaging``, ``snapshot``, ``latest_worker``, ``config``, ``metrics``.
"""
