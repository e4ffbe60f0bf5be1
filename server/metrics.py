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

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    Info,
    PlatformCollector,
    ProcessCollector,
)

from livefit import __version__
from livefit.server.metrics_learning import SIZE_BUCKETS, STEP_BUCKETS, LearningMetrics
from livefit.server.metrics_serving import DELAY_BUCKETS, LATENCY_BUCKETS, ServingMetrics

__all__ = ["DELAY_BUCKETS", "LATENCY_BUCKETS", "SIZE_BUCKETS", "STEP_BUCKETS", "Metrics"]


class Metrics(LearningMetrics, ServingMetrics):
    """The metric objects of one livefit process (learner or replica)."""

    def __init__(self, registry: CollectorRegistry | None = None, role: str = "learner") -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        ProcessCollector(
            registry=r
        )  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        PlatformCollector(registry=r)  # python_info
        self.build_info = Info("livefit_build", "livefit version and role", registry=r)
        self.build_info.info({"version": __version__, "role": role})
        for group in (
            self._broker, self._ingestion, self._ingest_sequence, self._ingest_health,
            self._training, self._training_state, self._serving, self._admission, self._http,
            self._weight_stream, self._durability, self._labels, self._gpu,
        ):  # fmt: skip
            group(r)

    def _gpu(self, r: CollectorRegistry) -> None:
        """The metrics of GPU memory (exported only where there is a GPU: watch_gpus)."""
        self.gpu_memory = Gauge(
            "livefit_gpu_memory_bytes",
            "GPU memory TensorFlow holds, by device and kind (current or peak); only with a GPU",
            ["device", "kind"],
            registry=r,
        )

    def watch_gpus(self) -> None:
        """Export TensorFlow's memory use of every visible GPU (read at scrape time)."""
        import tensorflow as tf

        def reader(device: str, kind: str) -> Callable[[], float]:
            return lambda: float(tf.config.experimental.get_memory_info(device)[kind])

        for index, _ in enumerate(tf.config.list_physical_devices("GPU")):
            for kind in ("current", "peak"):
                gauge = self.gpu_memory.labels(device=f"GPU:{index}", kind=kind)
                gauge.set_function(reader(f"GPU:{index}", kind))

    def init_model(self, model: str) -> None:
        """Create every per-model series at zero so dashboards and rate() see them at once."""
        for metric in (
            self.ingest_samples, self.queue_depth, self.train_steps, self.train_samples,
            self.train_yield_seconds, self.model_version, self.model_ready,
            self.predict_queue_rows, self.serving_version,
        ):  # fmt: skip
            metric.labels(model=model)
        self.ingest_messages.labels(model=model, outcome="accepted", reason="none")
        self.dead_letters.labels(model=model, outcome="sent")
