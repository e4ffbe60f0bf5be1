"""The learner's side of delayed labels: what the ingest worker calls, and nothing more.

The ingest worker treats a message on the model's labels or predictions topic like a sample
message: ``decode`` it (a ``Rejection`` is dead-lettered and acknowledged as usual), append
``wal_record(event)`` to the write-ahead log in the same group commit, acknowledge it only once
that is durable, then ``apply(event, position)``, which feeds the ``JoinStore`` in log order
and returns the samples it made (joins, default labels) for the model's queue, where
backpressure, freshness and training are those of any sample. Expiry is an event too: when
something is due, ``tick_due`` hands the worker a tick, logged like a message, so a replay
expires exactly what the first run did.

Restart: the store's state (including samples made but perhaps not trained yet) is saved with
every checkpoint (``notes``, a msgpack note stored as a tensor, so its size is not bounded by
the safetensors header) and ``restore``d; the runtime then replays
the log past the checkpoint through ``replay``: events the saved state already holds give back
their saved samples, later ones are applied anew. Nothing acknowledged is lost, and an id is
joined at most once (the store remembers joined ids), so a replayed join never trains twice.
Without a write-ahead log (``storage.wal = false``) events are applied as they come and a crash
loses the pending state.

Time: every event carries the learner's own time, from a ``SteadyClock`` (the wall clock read
once, then advanced by the monotonic clock, never behind the newest time in the store): a
message's time is when the ingest worker took it, a tick's the time it expires up to. A
wall-clock step changes neither TTLs nor their order, and no process's clock but the learner's
decides an expiry. A prediction record's serving time more than a few seconds ahead of its
arrival is counted (``livefit_clock_ahead_total``), logged (once a minute) and clamped.

Thread safety: ``apply`` and ``tick_due`` run on the ingest thread, ``notes`` on the trainer's,
``replay`` at start; one lock keeps the store consistent between them.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import msgpack
import numpy as np

from ..base.clocks import SteadyClock
from ..base.metrics import ClockMetrics, Metrics
from ..config.model import ModelSettings
from ..mqtt.connection import RawMessage
from ..storage.health import LogLimiter
from ..storage.wal import WalRecord
from ..wire.codec import SampleSpec
from ..wire.labels import LabelBatch, PredictionBatch, decode_labels, decode_predictions
from ..wire.rejection import Rejection
from ..wire.samples import SampleChunk
from .metrics import LabelMetrics
from .score import ServedScore
from .store import OUTCOMES, Applied, JoinStore, Policy, Shapes

log = logging.getLogger(__name__)
EVENT_CONTENT_TYPE = "application/vnd.livefit.label-event+msgpack"  # its log records
NOTE = "labels.msgpack"  # the checkpoint note holding the store (raw msgpack)
OLD_NOTE = "labels"  # the same, base64, in checkpoints of format 1 (read, not written)


@dataclass(frozen=True, slots=True)
class LabelEvent:
    """One event for the store: a label or prediction message (decoded), or an expiry tick."""

    kind: Literal["labels", "predictions", "tick"]
    received_at: float  # the learner's time (``SteadyClock``); for a tick: it expires up to
    decoded: LabelBatch | PredictionBatch | None = None
    payload: bytes = b""
    content_type: str | None = None


class LabelJoiner:
    """Joins one model's prediction records and labels into training samples."""

    def __init__(
        self,
        model: str,
        settings: ModelSettings,
        spec: SampleSpec,
        topics: tuple[str, str],  # (labels, predictions)
        metrics: Metrics,
        trained: Callable[[], int] = lambda: 0,
    ) -> None:
        self.model = model
        self.spec = spec
        self.labels_topic, self.predictions_topic = topics
        self.metrics = metrics
        metrics.group(LabelMetrics)
        self.trained = trained
        self.output_shape = tuple(settings.output_shape)
        labels = settings.labels
        default = labels.default_y
        self.tick_s = labels.tick_s
        self.store = JoinStore(
            Shapes(spec.input_shape, self.output_shape, spec.target_shape),
            Policy(
                labels.ttl_s, labels.max_pending, labels.on_expiry,
                None if default is None else np.asarray(default, np.float32).reshape(
                    spec.target_shape),
            ),
        )  # fmt: skip
        self.score = ServedScore(
            classification="crossentropy" in settings.loss or "accuracy" in settings.metrics,
            sparse=spec.target_shape == (),
            window=settings.prequential_window,
        )
        self._lock = threading.Lock()
        self._clock = SteadyClock()
        self._log_limiter = LogLimiter(60.0)
        self._next_tick = 0.0
        self._saved: dict[int, SampleChunk] = {}  # restored samples, by position, for replay
        for outcome in OUTCOMES:
            metrics.group(LabelMetrics).labels.labels(model=model, outcome=outcome)
        metrics.group(LabelMetrics).pending_predictions.labels(model=model).set_function(
            lambda: len(self.store.pending)
        )
        metrics.group(LabelMetrics).pending_labels.labels(model=model).set_function(
            lambda: len(self.store.early)
        )
        metrics.group(LabelMetrics).prediction_rows_rejected.labels(
            model=model, reason="non_finite"
        )
        metrics.group(ClockMetrics).clock_ahead.labels(model=model, source="prediction_record")

    # ingest side -------------------------------------------------------------------------------
    def owns(self, topic: str) -> bool:
        return topic in (self.labels_topic, self.predictions_topic)

    def decode(self, message: RawMessage) -> LabelEvent:
        """The event a message on one of our topics holds, at the learner's time now;
        ``Rejection`` if it is invalid."""
        return self._decode(message, self._now())

    def tick_due(self) -> LabelEvent | None:
        """An expiry tick when something has expired (checked every ``tick_s`` at most)."""
        mono = time.monotonic()
        if mono < self._next_tick:
            return None
        self._next_tick = mono + self.tick_s
        with self._lock:
            now = self._clock.now(self.store.now)
            due = self.store.due(now)
        return LabelEvent("tick", now) if due else None

    def _now(self) -> float:
        with self._lock:
            return self._clock.now(self.store.now)

    def _decode(self, message: RawMessage, at: float) -> LabelEvent:
        payload, content_type = message.payload, message.content_type
        if message.topic == self.predictions_topic:
            records = decode_predictions(payload, self.spec, self.output_shape, content_type)
            if records.non_finite:
                self._non_finite_rows(records.non_finite, len(records.ids))
            return LabelEvent("predictions", at, records, payload, content_type)
        try:
            decoded = decode_labels(payload, self.spec, content_type)
        except Rejection:
            self.metrics.group(LabelMetrics).labels.labels(
                model=self.model, outcome="rejected"
            ).inc()
            raise
        return LabelEvent("labels", at, decoded, payload, content_type)

    def _non_finite_rows(self, dropped: int, kept: int) -> None:
        self.metrics.group(LabelMetrics).prediction_rows_rejected.labels(
            model=self.model, reason="non_finite"
        ).inc(dropped)
        held_back = self._log_limiter.allow("non_finite")
        if held_back is not None:
            log.warning(
                "%s: left out %d prediction-record rows with NaN or infinity, kept the "
                "message's other %d%s", self.model, dropped, kept,
                f" ({held_back} more messages like it not logged)" if held_back else "",
            )  # fmt: skip

    @staticmethod
    def wal_record(event: LabelEvent) -> tuple[bytes, str]:
        """The event as a log record: (payload, content type)."""
        body = {
            "k": event.kind,
            "r": event.received_at,
            "c": event.content_type,
            "b": event.payload,
        }
        return msgpack.packb(body, use_bin_type=True), EVENT_CONTENT_TYPE

    def apply(self, event: LabelEvent, position: int | None) -> SampleChunk | None:
        """Feed ``event`` (durable at ``position``, or unlogged: None) to the store; the
        samples it made, if any."""
        with self._lock:
            self.store.trained_through(self.trained())
            if event.kind == "tick":
                applied = self.store.tick(event.received_at, position or 0)
            elif isinstance(event.decoded, PredictionBatch):
                applied = self.store.add_predictions(
                    event.decoded, event.received_at, position or 0
                )
            else:
                assert isinstance(event.decoded, LabelBatch)
                applied = self.store.add_labels(event.decoded, event.received_at, position or 0)
            self._observe(applied)
        return applied.chunk

    def _observe(self, applied: Applied) -> None:
        m, model = self.metrics.group(LabelMetrics), self.model
        for outcome, count in applied.outcomes.items():
            m.labels.labels(model=model, outcome=outcome).inc(count)
        if applied.ahead:
            self._clock_ahead(applied.ahead)
        delay = m.label_delay.labels(model=model)
        for seconds in applied.delays:
            delay.observe(seconds)
        if applied.served:
            for served, label in applied.served:
                self.score.add(served, label)
            for (metric, window), value in self.score.values().items():
                m.served_score.labels(model=model, metric=metric, window=window).set(value)

    def _clock_ahead(self, ahead: list[float]) -> None:
        self.metrics.group(ClockMetrics).clock_ahead.labels(
            model=self.model, source="prediction_record"
        ).inc(len(ahead))
        held_back = self._log_limiter.allow("clock_ahead")
        if held_back is not None:
            log.warning(
                "%s: %d prediction records dated up to %.0f s after they reached the learner "
                "(a serving process's clock is ahead, or the record lies); their TTL counts "
                "from their arrival%s", self.model, len(ahead), max(ahead),
                f" ({held_back} more like it not logged)" if held_back else "",
            )  # fmt: skip

    # restart side ------------------------------------------------------------------------------
    @staticmethod
    def owns_record(record: WalRecord) -> bool:
        return record.content_type == EVENT_CONTENT_TYPE

    def replay(self, record: WalRecord) -> SampleChunk | None:
        """Apply a logged event at start; the samples to queue (saved or newly made)."""
        if record.position <= self.store.applied:  # the restored state holds it already
            return self._saved.pop(record.position, None)
        try:
            event = self._event_of(record)
        except Rejection as exc:  # the model's shapes changed since
            log.warning("log record %d no longer fits %s: %s", record.position, self.model, exc)
            return None
        except Exception as exc:  # not a record this version wrote: skip it, never stop start
            log.error("log record %d of %s is unreadable (%s: %s); skipped", record.position,
                      self.model, type(exc).__name__, exc)  # fmt: skip
            return None
        return self.apply(event, record.position)

    def leftover(self) -> list[SampleChunk]:
        """Restored samples no replayed record claimed and not trained yet (their records were
        not replayed)."""
        trained = self.trained()
        chunks = sorted(self._saved.values(), key=lambda c: c.position or 0)
        self._saved.clear()
        return [c for c in chunks if (c.position or 0) > trained]

    def _event_of(self, record: WalRecord) -> LabelEvent:
        body = msgpack.unpackb(record.payload, raw=False)
        kind, received_at = body["k"], float(body["r"])
        if kind == "tick":
            return LabelEvent("tick", received_at)
        message = RawMessage(
            0, 0, self.labels_topic if kind == "labels" else self.predictions_topic,
            body["b"], body["c"], received_at,
        )  # fmt: skip
        return self._decode(message, received_at)

    def notes(self) -> dict[str, bytes]:
        """The store's state for a checkpoint (samples at or before ``trained()`` dropped)."""
        with self._lock:
            self.store.trained_through(self.trained())
            return {NOTE: self.store.dumps()}

    def restore(self, notes: dict[str, bytes]) -> None:
        """Take the state a checkpoint saved, if it has one."""
        data = notes.get(NOTE)
        if data is None and OLD_NOTE in notes:
            data = base64.b64decode(notes[OLD_NOTE])
        if data is None:
            return
        with self._lock:
            try:
                self.store.loads(data)
            except (ValueError, KeyError, TypeError) as exc:
                log.error("%s: saved delayed-label state unusable (%s); starting empty",
                          self.model, exc)  # fmt: skip
                return
            self._saved = {c.position: c for c in self.store.unsent if c.position is not None}
        log.info(
            "%s: restored %d pending predictions and %d early labels (log position %d)",
            self.model, len(self.store.pending), len(self.store.early), self.store.applied,
        )  # fmt: skip
