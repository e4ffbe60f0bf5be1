"""What the learner's and a replica's background parts have in common: settings, a metrics
registry labelled with the process's role, a start that cleans up after itself, and the one
serving half both put in front of their weights."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from ..base.metrics import Metrics
from ..config.model import ModelSettings
from ..config.settings import Settings
from ..serve.serving import ServedModel, ServingModel
from ..train.modeling import build_uncompiled
from ..wire.snapshot import Snapshot, SnapshotSlot


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


def serving_half(
    name: str, settings: ModelSettings, device: str, slot: SnapshotSlot,
    on_swap: Callable[[Snapshot], None],
) -> ServedModel:  # fmt: skip
    """Model ``name`` served from the newest snapshot in ``slot``: its own inference copy of
    the network, warmed up at every batch size; ``on_swap`` hears each version it swaps in."""
    serving = ServingModel(
        name,
        build_uncompiled(settings, device),
        settings.input_shape,
        settings.serve.batch_sizes(),
        source=lambda: slot.latest,
        device=device,
        on_swap=on_swap,
    )
    serving.warm_up()
    return ServedModel(name, settings, serving)
