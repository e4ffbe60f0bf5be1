"""A model as the HTTP API reaches it by name (``ModelEndpoint``): its settings, its serving copy
(``serving.ServingModel``), the past versions it keeps (``versions.KeptVersions``), the request
batcher in front of that copy and the prediction recorder (delayed labels). It starts and stops
the batcher on the event loop, feeds the serving metrics, and swaps newer weights in on the
model thread, between batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from ..base.metrics import Metrics
from ..config.model import ModelSettings
from ..labels.recorder import PredictionRecorder
from .admission import REFUSAL_REASONS
from .batch_cost import BatchCost
from .batch_types import BatchStats
from .batcher import RequestBatcher
from .metrics import AdmissionMetrics, ServingMetrics
from .serving import ServingModel
from .versions import KeptVersions

log = logging.getLogger(__name__)


class ModelEndpoint:
    """One model as the HTTP API reaches it by name, around its serving copy (``ServingModel``).

    Holds the model's settings, its serving copy, its request batcher and its prediction
    recorder; the runtimes build one per model they serve (``Runtime.endpoints()``)."""

    def __init__(
        self, name: str, settings: ModelSettings, serving: ServingModel,
        versions: KeptVersions | None = None,
    ) -> None:  # fmt: skip
        """``versions``: the past versions it answers by number (default: the current one)."""
        self.name = name
        self.settings = settings
        self.serving = serving
        self.versions = versions or KeptVersions(name, settings.versions, serving.source)
        self.batcher: RequestBatcher | None = None
        self.recorder: PredictionRecorder | None = None  # prediction records (delayed labels)
        # Told the queued rows whenever they change (on the event loop), beside the metric:
        # a split learner's serving process marks its busy board with it.
        self.on_queue_change: Callable[[int], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._refresh_queued = False

    def ready(self) -> bool:
        """True once the batcher runs and a snapshot exists to serve."""
        return self.batcher is not None and self.serving.source() is not None

    def busy(self) -> bool:
        """True while prediction requests wait in the batcher's queue (any thread may ask)."""
        batcher = self.batcher
        return batcher is not None and batcher.queued_rows > 0

    def _queue_listener(self, gauge: Callable[[int], None]) -> Callable[[int], None]:
        listener = self.on_queue_change
        if listener is None:
            return gauge

        def changed(rows: int) -> None:
            gauge(rows)
            listener(rows)

        return changed

    def start_batching(self, metrics: Metrics) -> None:
        """Create and start the request batcher on the running event loop."""
        metrics.group(ServingMetrics)
        metrics.group(AdmissionMetrics)
        serve = self.settings.serve
        name = self.name
        batch_size = metrics.group(ServingMetrics).predict_batch_size.labels(model=name)
        queue_seconds = metrics.group(ServingMetrics).predict_queue_seconds.labels(model=name)
        queue_rows = metrics.group(ServingMetrics).predict_queue_rows.labels(model=name)
        refused = {
            r: metrics.group(AdmissionMetrics).predict_refused.labels(model=name, reason=r)
            for r in REFUSAL_REASONS
        }
        timings = getattr(self.serving, "warm_timings", None)
        cost = (
            BatchCost.from_timings(timings)
            if timings
            else BatchCost(prior_rows=serve.max_batch_size)
        )
        cost_terms = {"per_row": lambda: cost.per_row_s, "per_batch": lambda: cost.per_batch_s}
        for term, read in cost_terms.items():  # read when scraped: nothing per request
            metrics.group(AdmissionMetrics).predict_batch_cost.labels(
                model=name, term=term
            ).set_function(read)

        def on_batch(stats: BatchStats) -> None:
            batch_size.observe(stats.rows)
            for waited in stats.queue_seconds:
                queue_seconds.observe(waited)

        self.batcher = RequestBatcher(
            name,
            self.serving.predict,
            max_batch_size=serve.max_batch_size,
            batch_timeout_ms=serve.batch_timeout_ms,
            max_queue_rows=serve.max_queue_rows,
            on_batch=on_batch,
            on_queue_change=self._queue_listener(queue_rows.set),
            max_queue_wait_ms=serve.max_queue_wait_ms,
            cost=cost,
            on_refuse=lambda reason: refused[reason].inc(),
            max_batch_timeout_ms=serve.max_batch_timeout_ms,
            auto_clock=self._model_clock(),
            inline=bool(getattr(self.serving, "runs_inline", lambda: False)()),
            predict_version=getattr(self.serving, "predict_version", None),
        )
        self.batcher.start()
        batcher = self.batcher
        metrics.group(AdmissionMetrics).predict_wait_bound.labels(model=name).set_function(
            batcher.admission.max_wait_s
        )
        metrics.group(AdmissionMetrics).predict_batch_timeout.labels(model=name).set_function(
            batcher.timeout_s
        )
        metrics.group(AdmissionMetrics).predict_expected_wait.labels(model=name).set_function(
            lambda: batcher.admission.expected_wait(1)[0]
        )
        self._loop = asyncio.get_running_loop()
        self.snapshot_arrived()  # serve the newest weights from the first request on

    def _model_clock(self) -> Callable[[], float]:
        """How "auto" times a model call: the model thread's CPU time on a CPU (its wall time
        there also counts waits for the GIL and for cores, which merging batches does not
        save), wall time on a GPU (the device's time is the cost)."""
        device = str(getattr(self.serving, "device", "")).upper()
        return time.monotonic if "GPU" in device else time.thread_time

    def snapshot_arrived(self, *_: object) -> None:
        """A newer snapshot exists: swap to it on the model thread now, between batches.

        Safe to call from any thread (the trainer's, an MQTT receiver's); calls made while a
        swap is already queued are folded into it.
        """
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing to serve
            loop.call_soon_threadsafe(self._queue_refresh)

    def _queue_refresh(self) -> None:
        if self._refresh_queued or self.batcher is None:
            return
        self._refresh_queued = True
        future = self.batcher.call_in_model_thread(self._refresh)
        future.add_done_callback(self._refresh_done)

    def _refresh(self) -> None:
        self._refresh_queued = False
        self.serving.refresh()

    def _refresh_done(self, future: asyncio.Future[object]) -> None:
        if not future.cancelled() and future.exception() is not None:
            log.error("weight swap failed for %s: %s", self.name, future.exception())

    async def stop_batching(self) -> None:
        self._loop = None
        if self.batcher is not None:
            await self.batcher.stop()
            self.batcher = None
