"""The metrics registry of one livefit process, and the families each part claims on it.

Names follow Prometheus conventions (base units, ``_total`` counters, ``_seconds``) and every
per-model series carries the label ``model``. Label values are bounded: model names come from
the config, rejection reasons from ``codec.REASONS``, HTTP codes from the few the API returns.

Each part of livefit declares its families in its own package (``<package>/metrics.py``): a
``MetricGroup`` subclass whose constructor creates them on the registry it is given. A part
claims the groups it updates with ``metrics.group(IngestMetrics)``: the first claim on a
registry creates the group's families there, every later claim returns the same instance. So a
process carries the families of the parts it runs only: a split learner's serving processes
carry no ingestion series and its training process no serving ones (a zero there would read as
"disconnected" or "serving version 0" to an alert). The build and process information and
``livefit_model_ready`` are always on the registry; so are the buckets every part shares.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Info,
    PlatformCollector,
    ProcessCollector,
)

from livefit import __version__

from .clocks import AHEAD_TOLERANCE_S

SIZE_BUCKETS = tuple(float(2**i) for i in range(14))  # 1 .. 8192 rows
STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
DELAY_BUCKETS = (
    0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0, 604800.0,
)  # fmt: skip


class MetricGroup:
    """The families one part of livefit updates, created on ``registry`` when constructed.

    ``init_model`` creates the group's per-model series at zero, so that dashboards and
    ``rate()`` see them before the first event; groups without per-model series keep it empty.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def init_model(self, model: str) -> None:
        """Create this group's series of ``model`` (nothing by default)."""


G = TypeVar("G", bound=MetricGroup)


class Metrics:
    """The metric families of one livefit process (learner or replica) on one registry.

    A group's families exist once a part claims the group (``group``); ``init_model`` creates
    each model's series in every group, claimed now or later.
    """

    def __init__(self, registry: CollectorRegistry | None = None, role: str = "learner") -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes
        PlatformCollector(registry=r)  # python_info
        self.build_info = Info("livefit_build", "livefit version and role", registry=r)
        self.build_info.info({"version": __version__, "role": role})
        self.model_ready = Gauge(
            "livefit_model_ready", "1 once the model is built and warmed up", ["model"], registry=r
        )
        self._groups: dict[type[MetricGroup], MetricGroup] = {}
        self._models: list[str] = []
        self._lock = threading.Lock()

    def group(self, family: type[G]) -> G:
        """The instance of ``family`` on this registry, created by the first claim."""
        found = self._groups.get(family)
        if found is None:
            with self._lock:
                found = self._groups.get(family)
                if found is None:
                    found = family(self.registry)
                    for model in self._models:
                        found.init_model(model)
                    self._groups[family] = found
        assert isinstance(found, family)
        return found

    @property
    def groups(self) -> frozenset[type[MetricGroup]]:
        """The groups claimed on this registry so far."""
        return frozenset(self._groups)

    def init_model(self, model: str) -> None:
        """Create every per-model series at zero so dashboards and rate() see them at once."""
        with self._lock:
            self._models.append(model)
            self.model_ready.labels(model=model)
            for found in self._groups.values():
                found.init_model(model)

    def watch_gpus(self) -> None:
        """Export TensorFlow's memory use of every visible GPU (read at scrape time); nothing
        where there is no GPU."""
        import tensorflow as tf

        def reader(device: str, kind: str) -> Callable[[], float]:
            return lambda: float(tf.config.experimental.get_memory_info(device)[kind])

        for index, _ in enumerate(tf.config.list_physical_devices("GPU")):
            for kind in ("current", "peak"):
                gauge = self.group(GpuMetrics).gpu_memory.labels(device=f"GPU:{index}", kind=kind)
                gauge.set_function(reader(f"GPU:{index}", kind))


class ErrorMetrics(MetricGroup):
    """The unexpected exceptions a background component caught and survived."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.internal_errors = Counter(
            "livefit_internal_errors_total",
            "Unexpected exceptions caught in a background component, which kept running",
            ["component"],
            registry=registry,
        )


class GpuMetrics(MetricGroup):
    """GPU memory TensorFlow holds (claimed only where there is a GPU: ``watch_gpus``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.gpu_memory = Gauge(
            "livefit_gpu_memory_bytes",
            "GPU memory TensorFlow holds, by device and kind (current or peak); only with a GPU",
            ["device", "kind"],
            registry=registry,
        )


class ClockMetrics(MetricGroup):
    """Times from other processes that were ahead of this process's clock."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.clock_ahead = Counter(
            "livefit_clock_ahead_total",
            f"Times another process stamped more than {AHEAD_TOLERANCE_S:g} s ahead of this "
            "process's clock (its clock is ahead, or was stepped), taken as this process's "
            "time instead: source prediction_record (at the learner, per row) or snapshot "
            "(at a replica)",
            ["model", "source"], registry=registry,
        )  # fmt: skip
