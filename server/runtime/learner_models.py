"""What the learner runs for each model: its parts (``ModelRuntime``), how they are built and
wired (``LearnerModels``, which ``LearnerRuntime`` inherits: the trainer restored and warmed,
the delayed-label join, the serving half, the weight stream, the ingest route and worker) and
what its trainer asks of the learner (``LearnerHooks``).

This module owns the per-model parts; the order they start and stop in is ``runtime``'s, and
the write-ahead log's replay and truncation ``learner_log``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from livefit.models.builders import weight_names

from ..base.metrics import Metrics
from ..config.model import ModelSettings
from ..config.settings import Settings
from ..ingest.dedup import SequenceTracker
from ..ingest.metrics import IngestSequenceMetrics
from ..ingest.route import Route
from ..ingest.sample_queue import SampleQueue
from ..ingest.worker import IngestWorker
from ..labels.joiner import LabelJoiner
from ..mqtt.connection import MqttConnection
from ..serve.metrics import ServingMetrics
from ..serve.serving import ServedModel
from ..storage.checkpoint import Checkpoint, CheckpointStore
from ..storage.health import StorageHealth
from ..storage.wal import WriteAheadLog
from ..train.hooks import TrainerHooks
from ..train.modeling import resolve_device
from ..train.trainer import Trainer
from ..weights.format import architecture_fingerprint
from ..weights.keys import learner_signing_key
from ..weights.publisher import WeightPublisher
from ..weights.store import WeightStore
from ..wire.codec import SampleSpec
from ..wire.snapshot import SnapshotSlot
from .process_runtime import serving_half

log = logging.getLogger(__name__)


@dataclass
class ModelRuntime:
    """Everything livefit runs for one configured model."""

    name: str
    settings: ModelSettings
    device: str
    queue: SampleQueue
    slot: SnapshotSlot
    trainer: Trainer | None = None
    served: ServedModel | None = None
    store: WeightStore | None = None
    publisher: WeightPublisher | None = None
    dedup: SequenceTracker | None = None  # (source, seq) numbers: dedup, or only counting gaps
    connection: MqttConnection | None = None
    ingest: IngestWorker | None = None
    labels: LabelJoiner | None = None  # joins its delayed labels to its predictions


class LearnerModels:
    """The per-model building half of ``LearnerRuntime``."""

    # kept by LearnerRuntime (and ProcessRuntime)
    settings: Settings
    metrics: Metrics
    wal: WriteAheadLog | None
    storage_health: StorageHealth
    _truncate_log: Callable[[Checkpoint], None]  # LearnerLog's
    report_drift: Callable[[str, int], None]  # LearnerRuntime's

    def _build_model(self, name: str, settings: ModelSettings, storage: Path) -> ModelRuntime:
        # The weight-signing key first (made on first start): a replica started beside this
        # learner on the same storage dir waits for its public key.
        learner_signing_key(settings.weights, storage, name)
        device = resolve_device(settings.device)
        runtime = ModelRuntime(
            name=name,
            settings=settings,
            device=device,
            queue=SampleQueue(settings.train.queue_capacity),
            slot=SnapshotSlot(),
            dedup=SequenceTracker(),
        )
        self.metrics.init_model(name)
        runtime.trainer = Trainer(
            name,
            settings,
            runtime.queue,
            runtime.slot,
            self.metrics,
            device,
            checkpoints=CheckpointStore(
                storage / "checkpoints" / name, name, settings.checkpoint.keep
            ),
            hooks=self._hooks(runtime),
            storage=self.storage_health,
        )
        runtime.trainer.on_checkpoint(self._truncate_log)
        runtime.trainer.warm_up()
        restored = runtime.trainer.restored_from
        if runtime.dedup and settings.dedup and restored and "dedup" in restored.notes:
            runtime.dedup.loads(restored.notes["dedup"].decode("utf-8", "replace"))
        runtime.labels = self._label_joiner(runtime)
        if restored is not None:
            runtime.labels.restore(restored.notes)
        runtime.served = self._build_served(name, settings, device, runtime.slot)
        self.metrics.model_ready.labels(model=name).set(1)
        log.info("model %s built on %s (%s builder)", name, device, settings.builder)
        return runtime

    def _label_joiner(self, runtime: ModelRuntime) -> LabelJoiner:
        trainer, name = runtime.trainer, runtime.name
        return LabelJoiner(
            runtime.name,
            runtime.settings,
            self._spec(runtime.settings),
            (self.settings.labels_topic(name), self.settings.predictions_topic(name)),
            self.metrics,
            trained=lambda: trainer.trained_position if trainer is not None else 0,
        )

    def _hooks(self, runtime: ModelRuntime) -> TrainerHooks:
        return LearnerHooks(self, runtime)

    def _build_served(
        self, name: str, settings: ModelSettings, device: str, slot: SnapshotSlot
    ) -> ServedModel | None:
        """Model ``name``'s serving half in this process (None: served elsewhere)."""
        self.metrics.group(ServingMetrics)
        version_gauge = self.metrics.group(ServingMetrics).serving_version.labels(model=name)
        return serving_half(
            name, settings, device, slot, lambda snapshot: version_gauge.set(snapshot.version)
        )

    def _start_weight_stream(self, runtime: ModelRuntime, connection: MqttConnection) -> None:
        """Serving swaps and MQTT publishing follow every snapshot from now on."""
        assert runtime.trainer is not None
        model = runtime.trainer.model
        names = weight_names(model)
        weights = runtime.settings.weights
        runtime.store = WeightStore(weights.keep_versions)
        runtime.publisher = WeightPublisher(
            model=runtime.name,
            topic=self.settings.weights_topic(runtime.name),
            names=names,
            fingerprint=architecture_fingerprint(names, model.get_weights()),
            connection=connection,
            metrics=self.metrics,
            store=runtime.store,
            signer=learner_signing_key(weights, self.settings.storage.dir, runtime.name),
            max_inline_bytes=weights.max_inline_bytes,
            hmac_key=weights.key_bytes(),
            refresh_interval_s=weights.refresh_interval_s,
            publish_interval_s=weights.publish_interval_s,
        )
        runtime.publisher.watch_topic()  # the connection starts after this
        runtime.slot.subscribe(runtime.publisher.offer)
        if runtime.served is not None:
            runtime.slot.subscribe(runtime.served.snapshot_arrived)
        runtime.publisher.start()
        if runtime.slot.latest is not None:
            runtime.publisher.offer(runtime.slot.latest)

    def _ingest_worker(self, runtime: ModelRuntime, route: Route) -> IngestWorker:
        assert runtime.connection is not None
        storage = self.settings.storage
        worker = IngestWorker(
            runtime.connection,
            route,
            self.metrics,
            self.wal,
            storage.wal_group_max,
            commit_window_s=storage.wal_commit_window_ms / 1000.0 if self.wal is not None else 0.0,
            storage=self.storage_health,
            stall_after_s=runtime.settings.stall_after_s,
            silent_topic_warn_s=runtime.settings.silent_topic_warn_s,
        )
        stalled = self.metrics.group(IngestSequenceMetrics).ingest_stalled.labels(
            model=runtime.name
        )
        stalled.set_function(lambda: float(worker.stalled()))
        silence = self.metrics.group(IngestSequenceMetrics).ingest_seconds_since_message.labels(
            model=runtime.name
        )
        silence.set_function(worker.seconds_since_message)
        return worker

    def _route(self, runtime: ModelRuntime, subscription: str) -> Route:
        s = runtime.settings
        return Route(
            model=runtime.name,
            subscription=subscription,
            spec=self._spec(s),
            queue=runtime.queue,
            dead_letter_topic=self.settings.dead_letter_topic(runtime.name),
            sequences=runtime.dedup,
            drop_duplicates=s.dedup,
            labels=runtime.labels,
        )

    @staticmethod
    def _spec(s: ModelSettings) -> SampleSpec:
        return SampleSpec(
            input_shape=tuple(s.input_shape),
            target_shape=tuple(s.resolved_target_shape()),
            max_message_bytes=s.max_message_bytes,
            max_samples=s.max_samples_per_message,
        )


class LearnerHooks(TrainerHooks):
    """What model ``runtime``'s trainer asks of the learner around it."""

    def __init__(self, learner: LearnerModels, runtime: ModelRuntime) -> None:
        self.learner = learner
        self.runtime = runtime

    def predictions_waiting(self) -> bool:
        served = self.runtime.served
        return served is not None and served.busy()

    def log_frontier(self, trained_position: int) -> int:
        wal = self.learner.wal
        return wal.frontier(self.runtime.name, trained_position) if wal is not None else 0

    def checkpoint_notes(self) -> dict[str, bytes]:
        """The dedup sequence numbers and the delayed labels' pending state."""
        runtime = self.runtime
        tracker = runtime.dedup if runtime.settings.dedup else None
        found = {"dedup": tracker.dumps().encode()} if tracker is not None else {}
        if runtime.labels is not None:
            found.update(runtime.labels.notes())
        return found

    def drift_detected(self, detections: int) -> None:
        self.learner.report_drift(self.runtime.name, detections)
