"""The weight stream: the signed envelope (``format``), keys and their discovery (``keys``), a
receiver's verification policy (``receiver_auth``), the learner's publisher (``publisher``;
what it keeps for HTTP pulls, ``store``; its log lines about versions, ``version_log``), the
verification every receiver runs (``verifier``), the MQTT receiver of replicas and clients
(``receiver``) and a split learner's local feed to its serving processes (``local_feed``).

Imports ``mqtt``, ``wire`` (snapshots), ``config`` and ``base``.
"""
