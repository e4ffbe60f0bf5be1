"""What the learner's and a replica's background parts have in common: settings, a metrics
registry labelled with the process's role, and a start that cleans up after itself."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from livefit.server.config import Settings
from livefit.server.metrics import Metrics


class ProcessRuntime:
    """Base of ``LearnerRuntime`` and ``ReplicaRuntime``; subclasses set ``role`` and implement
    ``_start`` and ``stop`` (``stop`` must work on a partly started runtime)."""

    role = "process"

    def __init__(self, settings: Settings, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.metrics = Metrics(registry, role=self.role)
        self.started = False

    def start(self) -> None:
        """Start every part; raises (after stopping what did start) if a part cannot start."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.started = True

    def _start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError
