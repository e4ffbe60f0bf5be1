"""Every Prometheus metric livefit exports, created on one registry per app instance.

Names follow Prometheus conventions (base units, ``_total`` counters, ``_seconds``) and every
per-model series carries the label ``model``. Label values are bounded: model names come from
the config, rejection reasons from ``codec.REASONS``, HTTP codes from the few the API returns.

The families are declared by area in ``metrics_learning`` (broker, ingestion, training,
durability) and ``metrics_serving`` (serving, admission, HTTP, weight stream, labels), which
``Metrics`` inherits; this module owns the class, the process and build information, the GPU
gauges and the per-model series created at zero. The buckets are re-exported here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    Info,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.registry import Collector

from livefit import __version__

from .metrics_learning import LearningMetrics
from .metrics_serving import ServingMetrics

# The families each part of livefit exports, by the name the part claims them with
# (``Metrics.export``): a process exports only the families of the parts it runs, so a split
# learner's serving processes carry no ingestion series and its training process no serving
# ones (a zero there would read as "disconnected" or "serving version 0" to an alert).
GROUPS = (
    "broker", "publish_refused", "ingestion", "ingest_sequence", "ingest_health", "errors",
    "training", "training_state", "durability", "serving", "admission", "http", "weights_published",
    "weights_received", "freshness", "labels", "prediction_records", "gpu",
)  # fmt: skip


class Metrics(LearningMetrics, ServingMetrics):
    """The metric objects of one livefit process (learner or replica).

    Every family exists as an attribute from the start, so any code may update it; a family is
    on ``registry`` (and so on ``/metrics``) once a part of this process claims its group with
    ``export``. The build and process information and ``livefit_model_ready`` are always on it.
    """

    def __init__(self, registry: CollectorRegistry | None = None, role: str = "learner") -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        ProcessCollector(
            registry=r
        )  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        PlatformCollector(registry=r)  # python_info
        self.build_info = Info("livefit_build", "livefit version and role", registry=r)
        self.build_info.info({"version": __version__, "role": role})
        self.model_ready = Gauge(
            "livefit_model_ready", "1 once the model is built and warmed up", ["model"], registry=r
        )
        self._groups: dict[str, list[Collector]] = {}
        self._exported: set[str] = set()
        self._export_lock = threading.Lock()
        for group in GROUPS:
            before = set(vars(self))
            getattr(self, f"_{group}")()
            self._groups[group] = [v for k, v in vars(self).items() if k not in before]

    def export(self, *groups: str) -> None:
        """Put the families of ``groups`` (names in ``GROUPS``) on the registry; a group
        already exported is left as it is, so every part may claim what it updates."""
        with self._export_lock:
            for group in groups:
                if group not in self._exported:
                    for collector in self._groups[group]:
                        self.registry.register(collector)
                    self._exported.add(group)

    @property
    def exported(self) -> frozenset[str]:
        """The groups on the registry now."""
        return frozenset(self._exported)

    def _gpu(self) -> None:
        """The metrics of GPU memory (exported only where there is a GPU: watch_gpus)."""
        self.gpu_memory = Gauge(
            "livefit_gpu_memory_bytes",
            "GPU memory TensorFlow holds, by device and kind (current or peak); only with a GPU",
            ["device", "kind"],
            registry=None,
        )

    def watch_gpus(self) -> None:
        """Export TensorFlow's memory use of every visible GPU (read at scrape time)."""
        import tensorflow as tf

        def reader(device: str, kind: str) -> Callable[[], float]:
            return lambda: float(tf.config.experimental.get_memory_info(device)[kind])

        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            self.export("gpu")
        for index, _ in enumerate(gpus):
            for kind in ("current", "peak"):
                gauge = self.gpu_memory.labels(device=f"GPU:{index}", kind=kind)
                gauge.set_function(reader(f"GPU:{index}", kind))

    def init_model(self, model: str) -> None:
        """Create every per-model series at zero so dashboards and rate() see them at once."""
        for metric in (
            self.ingest_samples, self.queue_depth, self.train_steps, self.train_samples,
            self.train_yield_seconds, self.model_version, self.model_ready,
            self.predict_queue_rows, self.serving_version, self.train_nonfinite,
            self.train_outliers,
        ):  # fmt: skip
            metric.labels(model=model)
        self.ingest_messages.labels(model=model, outcome="accepted", reason="none")
        self.dead_letters.labels(model=model, outcome="sent")
