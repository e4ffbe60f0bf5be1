"""What survives a restart: the write-ahead log (``wal``), checkpoints (``checkpoint``), the
storage health that readiness reports (``health``), the lock that keeps a second learner off the
same directory (``lock``) and its watch (``watch``).

Imports ``base`` and ``wire`` (a checkpoint is made from a snapshot). The write-ahead log is
here rather than in ``ingest``: it is a record layout on disk with its fault semantics, and
both ``ingest`` (appends) and ``labels`` (replays label records) read its records.
"""
