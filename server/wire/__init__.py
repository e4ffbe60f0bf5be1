"""Formats, no I/O: what travels between processes and how it is checked. The payload formats
publishers and the server share (``formats``, one registry entry each, also read by
``livefit.clients``), the sample decoder (``codec``; its fields ``codec_fields``; what decoders
raise, ``rejection``), the sample types it decodes into (``samples``), label messages and
prediction records (``labels``; the per-row ids, ``label_ids``) and the snapshot, the unit of
everything downstream of a trainer (``snapshot``).

Imports ``base`` only. The bounded sample queue is ``ingest``'s: a queue is behaviour, not a
format. The formats live here, not in ``livefit/``: the clients import ``server`` lower
packages anyway, and a server package importing the top-level ``livefit`` commands' package
would point up.
"""
