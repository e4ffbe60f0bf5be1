"""What survives a restart: checkpoints (``checkpoint``), the storage health that readiness
reports (``storage_health``) and the lock that keeps a second learner off the same directory
(``storage_lock``).

Imports: ``metrics``; ``snapshot`` for types only (a checkpoint is made from a snapshot).
"""
