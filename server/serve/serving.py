"""The serving copy of a model: its own weights, swapped only between batches.

A ``ServingModel`` is used by exactly one thread (its batcher's executor, or the event loop for
a model cheap enough to be called there: ``runs_inline``). Before each batch it
looks at its snapshot source; when a newer snapshot is there it loads those weights into its
runtime (``runtimes``: the graph of ``keras``, ``xla``, or a NumPy forward pass), and the whole
batch then runs on that one version, which is returned with the outputs. A compiled runtime is
compiled once per padded batch size (the sizes in ``allowed_batch_sizes``), so the set of
compiled shapes is bounded whatever batch sizes arrive; padding never leaves this class (the
NumPy runtime compiles nothing and is not padded).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import threading
import time
from collections.abc import Callable

import keras
import numpy as np

from ..base.metrics import Metrics
from ..config.model import ModelSettings
from ..labels.recorder import PredictionRecorder
from ..wire.snapshot import Snapshot
from .admission import REFUSAL_REASONS
from .batch_cost import BatchCost
from .batch_types import BatchStats
from .batcher import RequestBatcher
from .metrics import AdmissionMetrics, ServingMetrics
from .runtimes import build_runtime

log = logging.getLogger(__name__)

SnapshotSource = Callable[[], Snapshot | None]
# A model call cheaper than this runs on the event loop (``RequestBatcher(inline=True)``). why:
# the hand-over to the model thread and back costs more than a NumPy forward pass of a small
# MLP (BENCHMARKS.md#serving-throughput-and-latency; figures: docs/benchmarks/defaults.md).
INLINE_MAX_CALL_S = 0.5e-3


class NotReady(Exception):
    """No weights yet: the model cannot answer (HTTP 503)."""


class ServingModel:
    """Predicts with the newest snapshot from ``source``, padded to ``batch_sizes`` where the
    runtime compiles per shape; ``runtime`` is ``serve.runtime`` (``runtimes.build_runtime``:
    ``model`` is what it computes, and its weights are the runtime's to set)."""

    def __init__(
        self,
        name: str,
        model: keras.Model,
        input_shape: list[int],
        batch_sizes: list[int],
        source: SnapshotSource,
        device: str,
        on_swap: Callable[[Snapshot], None] | None = None,
        runtime: str = "keras",
    ) -> None:
        self.name = name
        self.model = model
        self.input_shape = list(input_shape)
        self.batch_sizes = sorted(batch_sizes)
        self.source = source
        self.device = device
        self.on_swap = on_swap
        self.snapshot: Snapshot | None = None
        self.warm_timings: dict[int, float] = {}  # batch size -> seconds of one call, warm
        self._owner: int | None = None
        self.runtime = build_runtime(runtime, model, input_shape, device, name)
        log.debug("model %s serves with the %s runtime", name, self.runtime.name)

    @property
    def version(self) -> int | None:
        return self.snapshot.version if self.snapshot else None

    @property
    def max_batch_size(self) -> int:
        return self.batch_sizes[-1]

    def runs_inline(self) -> bool:
        """True when a full batch, warm, costs less than ``INLINE_MAX_CALL_S`` on a runtime
        that holds the GIL throughout (NumPy): handing such a call to the model thread and its
        answer back to the event loop costs more than the call (known after ``warm_up``)."""
        full = self.warm_timings.get(self.max_batch_size)
        return self.runtime.name == "numpy" and full is not None and full < INLINE_MAX_CALL_S

    def warm_up(self) -> None:
        """Compile and run once per allowed batch size, so no request pays for tracing; then
        time the smallest and largest sizes (the batch cost's starting point)."""
        for size in self.batch_sizes:
            self.runtime(np.zeros((size, *self.input_shape), dtype=np.float32))
        for size in {self.batch_sizes[0], self.batch_sizes[-1]}:
            rows = np.zeros((size, *self.input_shape), dtype=np.float32)
            times = []
            for _ in range(3):
                started = time.perf_counter()
                self.runtime(rows)
                times.append(time.perf_counter() - started)
            self.warm_timings[size] = sorted(times)[1]

    def refresh(self) -> Snapshot | None:
        """Swap to the source's newest snapshot if it is newer than ours (a later version, or
        another lineage); return ours."""
        latest = self.source()
        if latest is not None and latest is not self.snapshot and latest.newer_than(self.snapshot):
            self.runtime.load(latest.weights)
            self.snapshot = latest
            if self.on_swap is not None:
                self.on_swap(latest)
        return self.snapshot

    def predict(self, rows: np.ndarray) -> tuple[np.ndarray, int]:
        """Outputs for ``rows`` (N, *input_shape) and the version that computed all of them."""
        self._check_thread()
        snapshot = self.refresh()
        if snapshot is None:
            raise NotReady(f"model {self.name} has no weights yet")
        outputs = [self._run_padded(part) for part in self._parts(rows)]
        return (outputs[0] if len(outputs) == 1 else np.concatenate(outputs)), snapshot.version

    def padded_size(self, rows: int) -> int:
        """The allowed batch size a call with ``rows`` rows is padded to."""
        return self.batch_sizes[bisect.bisect_left(self.batch_sizes, rows)]

    def _parts(self, rows: np.ndarray) -> list[np.ndarray]:
        step = self.max_batch_size
        return [rows[i : i + step] for i in range(0, rows.shape[0], step)]

    def _run_padded(self, rows: np.ndarray) -> np.ndarray:
        n = rows.shape[0]
        size = self.padded_size(n) if self.runtime.pads else n
        if size != n:
            padded = np.zeros((size, *rows.shape[1:]), dtype=np.float32)
            padded[:n] = rows
            rows = padded
        return self.runtime(rows)[:n]

    def _check_thread(self) -> None:
        """Only one thread may use a serving model (its weights change between calls)."""
        ident = threading.get_ident()
        if self._owner is None:
            self._owner = ident
        elif self._owner != ident:
            raise RuntimeError(f"serving model {self.name} used from two threads")


class ServedModel:
    """One model as the prediction API sees it: settings, serving copy and request batcher."""

    def __init__(self, name: str, settings: ModelSettings, serving: ServingModel) -> None:
        self.name = name
        self.settings = settings
        self.serving = serving
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
