"""The learner process's background parts, started and stopped together in a fixed order.

Preflight (before anything touches storage or the broker): lock the storage directory, remove
temporary files a crash left. Start: broker (resolve, maybe launch) -> every model built ->
each restored from its newest checkpoint and warmed -> weight publishers -> trainers -> replay
of the write-ahead log past each checkpoint -> one ingest worker and one MQTT session per
model -> connect. Stop: ingest (nothing new is accepted; what was not acknowledged stays with
the broker) -> trainers (train what was accepted, final snapshot, final checkpoint) -> weight
publishers (the final snapshot goes out) -> MQTT -> the log -> the broker livefit launched ->
the storage lock.

Each model has its own MQTT session (client id ``<broker.client_id>-<model>``), receive window
and ingest worker: a model whose trainer cannot keep up holds back only its own stream, and the
others keep their latency. All models share one write-ahead log.

This module owns that order (``LearnerRuntime``), readiness, and what the learner runs for each
model (``ModelRuntime``): how its parts are built and wired, and what its trainer asks of the
learner (``LearnerHooks``). The log's replay and truncation are ``learner_log``'s.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from livefit.models.builders import weight_names

from ..base.metrics import Metrics
from ..config.broker_urls import BrokerAddress
from ..config.model import ModelSettings
from ..config.settings import Settings
from ..ingest.dedup import SequenceTracker
from ..ingest.metrics import IngestSequenceMetrics
from ..ingest.route import Route
from ..ingest.sample_queue import SampleQueue
from ..ingest.worker import IngestWorker
from ..labels.joiner import LabelJoiner
from ..labels.recorder import recorder_for
from ..mqtt.connection import MqttConnection
from ..mqtt.probe import for_broker
from ..serve.endpoint import ModelEndpoint
from ..serve.guard import Guard, ReferenceFile, ScoredBatch, numpy_losses, snapshot_predict
from ..serve.metrics import ServingMetrics, VersionRecordMetrics
from ..serve.runtimes import NumpyRuntime, build_runtime, second_runtime
from ..serve.version_book import Move, MoveRefused, VersionBook
from ..serve.versions import CheckpointShelf, KeptVersions
from ..storage.checkpoint import CheckpointStore
from ..storage.health import StorageHealth
from ..storage.lock import StorageLock
from ..storage.serving_record_file import ServingRecordFile
from ..storage.watch import StorageWatch
from ..train.hooks import TrainerHooks
from ..train.metrics import TrainingStateMetrics
from ..train.modeling import (
    enable_gpu_memory_growth,
    network_description,
    resolve_device,
    training_placement,
)
from ..train.selection import Switch
from ..train.trainer import Trainer
from ..weights.format import architecture_fingerprint
from ..weights.keys import learner_signing_key
from ..weights.publisher import WeightPublisher
from ..weights.store import WeightStore
from ..wire.codec import SampleSpec
from ..wire.samples import Batch
from ..wire.serving_record import ServingRecord
from ..wire.snapshot import Snapshot, SnapshotSlot
from .broker import ManagedBroker, resolve_broker
from .learner_log import LearnerLog
from .process_runtime import build_endpoint, checkpoint_directory, start_all_or_none

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
    endpoint: ModelEndpoint | None = None
    store: WeightStore | None = None
    publisher: WeightPublisher | None = None
    dedup: SequenceTracker | None = None  # (source, seq) numbers: dedup, or only counting gaps
    connection: MqttConnection | None = None
    ingest: IngestWorker | None = None
    labels: LabelJoiner | None = None  # joins its delayed labels to its predictions
    book: VersionBook | None = None  # its serving record: labels, the pin, rollbacks
    guard: Guard | None = None  # holds the last good version in serving (guard.enabled)
    held_published: set[int] = field(default_factory=set)  # retained on the held topics


class LearnerRuntime:
    """Owns the broker connection, the write-ahead log and each model's parts (its MQTT
    session, ingest worker, trainer, weight stream and serving half)."""

    role = "learner"
    wait_newer_weights_s = 0.0  # every version is published from here: none is on its way

    def __init__(
        self,
        settings: Settings,
        registry: CollectorRegistry | None = None,
        lock_owner_pid: int | None = None,
        storage_lock: StorageLock | None = None,
    ) -> None:
        """``lock_owner_pid``: the process the storage lock names (None: this one);
        ``storage_lock``: the lock, where it was taken before (None: ``preflight`` takes it)."""
        self.settings = settings
        self.lock_owner_pid = lock_owner_pid
        self.metrics = Metrics(registry, role=self.role)
        self.started = False
        self.models: dict[str, ModelRuntime] = {}
        self.managed_broker: ManagedBroker | None = None
        self.learner_log = LearnerLog(self.models, self.metrics)
        self.storage_lock = storage_lock or StorageLock(Path(settings.storage.dir))
        self.storage_health = StorageHealth(self.metrics)
        # The storage dir deleted or replaced: the log takes nothing more, so nothing more is
        # acknowledged.
        self.storage_watch = StorageWatch(
            self.storage_lock, self.storage_health, self.learner_log.mark_lost
        )

    def preflight(self) -> None:
        """The cheap checks that must pass before anything else starts: raises
        ``StorageLocked`` naming the other process when the storage dir is in use."""
        self.storage_lock.acquire(self.settings.http.port, self.lock_owner_pid)
        _remove_temporary_files(Path(self.settings.storage.dir))

    def start(self) -> None:
        """Start every part; raises (after stopping what did start) if a part cannot start."""
        start_all_or_none(self._start, self.stop)
        self.started = True

    def _start(self) -> None:
        storage = Path(self.settings.storage.dir)
        self.preflight()
        nodes, self.managed_broker = resolve_broker(self.settings.broker.url, storage)
        enable_gpu_memory_growth()
        self.metrics.watch_gpus()
        self.learner_log.create(self.settings.storage)
        for name, model_settings in self.settings.models.items():
            self.models[name] = self._build_model(name, model_settings, storage)
        for runtime in self.models.values():  # once every model is built: see _warm_up
            self._warm_up(runtime)
        self.learner_log.open()
        self.storage_watch.start()
        routes = self._sessions(nodes)
        for runtime in self.models.values():
            assert runtime.connection is not None
            self._start_weight_stream(runtime, runtime.connection)
        for runtime in self.models.values():
            assert runtime.trainer is not None
            runtime.trainer.start()
        self.learner_log.replay(routes)
        for runtime in self.models.values():
            assert runtime.ingest is not None and runtime.connection is not None
            runtime.ingest.start()
            runtime.connection.start()
        deadline = time.monotonic() + self.settings.broker.connect_timeout_s
        for runtime in self.models.values():
            assert runtime.connection is not None
            if not runtime.connection.wait_connected(max(0.0, deadline - time.monotonic())):
                log.warning(
                    "not connected to %s yet; paho keeps retrying",
                    ", ".join(str(node) for node in nodes),
                )
                break

    def _sessions(self, nodes: Sequence[BrokerAddress]) -> list[Route]:
        """One MQTT session per model (samples, labels and predictions subscribed), with its
        ingest route and worker, and its prediction recorder where it serves here."""
        protocol = self.managed_broker.protocol if self.managed_broker else None
        broker = for_broker(nodes, self.settings.broker, protocol)
        routes = []
        for name, runtime in self.models.items():
            runtime.connection = MqttConnection(
                nodes, broker, self.metrics,
                client_id=f"{self.settings.broker.client_id}-{name}",
            )  # fmt: skip
            subscription = self.settings.samples_topic(name)
            runtime.connection.add_subscription(subscription, qos=1)
            runtime.connection.add_subscription(self.settings.labels_topic(name), qos=1)
            runtime.connection.add_subscription(self.settings.predictions_topic(name), qos=1)
            route = self._route(runtime, subscription)
            routes.append(route)
            if runtime.endpoint is not None:  # a split learner serves from other processes
                runtime.endpoint.recorder = recorder_for(
                    self.settings, name, nodes, self.metrics,
                    f"{self.settings.broker.client_id}-{name}-predictions", broker.protocol,
                )  # fmt: skip
            runtime.ingest = self._ingest_worker(runtime, route)
        return routes

    # each model's parts -----------------------------------------------------------------------
    def _build_model(self, name: str, settings: ModelSettings, storage: Path) -> ModelRuntime:
        # The weight-signing key first (made on first start): a replica started beside this
        # learner on the same storage dir waits for its public key.
        learner_signing_key(settings.weights, storage, name)
        device = resolve_device(settings.device)  # serving's: one device
        placement = training_placement(self.settings.tensorflow, settings.device)
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
            placement,
            checkpoints=CheckpointStore(
                checkpoint_directory(storage, name), name, settings.checkpoint.keep
            ),
            hooks=self._hooks(runtime),
            storage=self.storage_health,
        )
        runtime.trainer.on_checkpoint(self.learner_log.truncate)
        runtime.labels = self._label_joiner(runtime)
        runtime.endpoint = self._build_endpoint(name, settings, device, runtime.slot)
        log.info("model %s built (%s builder): trains on %s, serves on %s", name,
                 settings.builder, ", ".join(placement.devices), device)  # fmt: skip
        return runtime

    def _warm_up(self, runtime: ModelRuntime) -> None:
        """Restore ``runtime``'s trainer, its dedup and label state from the newest checkpoint
        and warm its step (``Trainer.warm_up``). Only once every Keras model of the process is
        built: building one with a seed sets TensorFlow's global seed, which empties its kernel
        caches, so a step warmed before that builds its kernels again on its first batch
        (docs/design.md, "Training step")."""
        trainer = runtime.trainer
        assert trainer is not None and runtime.labels is not None
        trainer.warm_up()
        restored = trainer.restored_from
        notes = restored.notes if restored is not None else {}
        if runtime.dedup and runtime.settings.dedup and "dedup" in notes:
            runtime.dedup.loads(notes["dedup"].decode("utf-8", "replace"))
        if restored is not None:
            runtime.labels.restore(notes)
        self.metrics.model_ready.labels(model=runtime.name).set(1)

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

    def _build_endpoint(
        self, name: str, settings: ModelSettings, device: str, slot: SnapshotSlot
    ) -> ModelEndpoint | None:
        """Model ``name``'s endpoint in this process (None: served elsewhere)."""
        self.metrics.group(ServingMetrics)
        version_gauge = self.metrics.group(ServingMetrics).serving_version.labels(model=name)
        return build_endpoint(
            name, settings, device, slot, lambda snapshot: version_gauge.set(snapshot.version),
            checkpoint_directory(Path(self.settings.storage.dir), name),
        )  # fmt: skip

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
            description=network_description(model, runtime.settings),
        )
        runtime.publisher.watch_topic()  # the connection starts after this
        runtime.book = self._version_book(runtime)
        record = runtime.book.restore()
        runtime.publisher.serving_record = record.encode()
        self._announce_held(runtime, record)
        runtime.slot.subscribe(runtime.publisher.offer)
        if runtime.endpoint is not None:
            runtime.slot.subscribe(runtime.endpoint.snapshot_arrived)
        runtime.publisher.start()
        if runtime.slot.latest is not None:
            runtime.publisher.offer(runtime.slot.latest)
        runtime.guard = self._guard(runtime)
        if runtime.guard is not None:  # last: it moves the book over versions already kept
            runtime.slot.subscribe(runtime.guard.snapshot_arrived)
            runtime.guard.start()
            if runtime.slot.latest is not None:
                runtime.guard.snapshot_arrived(runtime.slot.latest)

    def _guard(self, runtime: ModelRuntime) -> Guard | None:
        """Model ``runtime``'s guard when enabled: it scores each snapshot on the reference set
        on its own thread, with a runtime of its own on the CPU (a NumPy pass, else a clone's
        graph): never serving's copy, never the trainer's thread."""
        settings, trainer, book = runtime.settings, runtime.trainer, runtime.book
        if not settings.guard.enabled:
            return None
        assert trainer is not None and book is not None
        path = settings.guard.reference_path
        losses = numpy_losses(settings.loss)  # an unknown loss: refused here, at start
        reference = None
        if path is not None:
            shape, target = settings.input_shape, settings.resolved_target_shape()
            reference = ReferenceFile(path, shape, target)
            log.info("model %s: the guard scores each version on %d reference samples (%s, "
                     "read again when it changes)", runtime.name, len(reference.current.x),
                     path)  # fmt: skip
        else:
            log.info("model %s: the guard compares the newest and the last good version on the "
                     "samples learned (no reference set)", runtime.name)  # fmt: skip
        model, shape, cpu = trainer.model, settings.input_shape, "/CPU:0"
        probe = build_runtime("auto", model, shape, cpu, runtime.name)
        own = probe if isinstance(probe, NumpyRuntime) else second_runtime(probe, model, shape, cpu)
        return Guard(
            runtime.name, settings.guard, book, snapshot_predict(own), losses, self.metrics,
            lambda event: self._publish_event(runtime.name, event), reference,
            samples_seen=lambda: trainer.samples_seen,
        )  # fmt: skip

    def _version_book(self, runtime: ModelRuntime) -> VersionBook:
        """Model ``runtime``'s serving record, checked against the versions this process keeps
        (its endpoint's; a training process keeps its own over the same snapshots)."""
        trainer, publisher = runtime.trainer, runtime.publisher
        assert trainer is not None and publisher is not None
        directory = checkpoint_directory(Path(self.settings.storage.dir), runtime.name)
        versions = runtime.endpoint.versions if runtime.endpoint is not None else None
        if versions is None:
            shelf = CheckpointShelf(directory) if runtime.settings.versions.checkpoints else None
            versions = KeptVersions(
                runtime.name, runtime.settings.versions, lambda: runtime.slot.latest, shelf
            )
            runtime.slot.subscribe(versions.add)
            if runtime.slot.latest is not None:
                versions.add(runtime.slot.latest)

        def continue_from(snapshot: Snapshot, timeout: float) -> int:
            return trainer.continue_from(list(snapshot.weights), snapshot.version, timeout)

        return VersionBook(
            runtime.name, versions, ServingRecordFile(directory),
            encode=lambda snapshot: publisher.encode(snapshot).payload,
            lineage=lambda: trainer.lineage,
            announce=lambda record, added, move: self._announce(runtime, record, added, move),
            continue_from=continue_from,
        )  # fmt: skip

    @property
    def version_control(self) -> LearnerRuntime:
        """Who makes an operator's moves here: this learner (``move``)."""
        return self

    def move(self, name: str, move: Move) -> ServingRecord:
        """Make ``move`` on model ``name``'s serving record (``VersionBook.move``)."""
        runtime = self.models.get(name)
        if runtime is None or runtime.book is None:
            raise MoveRefused(404, f"model {name} is not trained here")
        return runtime.book.move(move)

    def _announce(
        self, runtime: ModelRuntime, record: ServingRecord, added: dict[int, bytes], move: Move
    ) -> None:
        """A move is durable: the weight stream signs it in (and retains the newly named
        payloads, deletes the released ones), the event topic and the metrics hear it."""
        publisher = runtime.publisher
        assert publisher is not None
        for version, payload in added.items():
            publisher.publish_held(version, payload)
        for version in runtime.held_published - set(record.versions):
            publisher.release_held(version)
        runtime.held_published = set(record.versions)
        publisher.announce(record.encode())
        self._record_moved(runtime)
        metrics = self.metrics.group(VersionRecordMetrics)
        metrics.version_moves.labels(model=runtime.name, action=move.action).inc()
        metrics.held(runtime.name, record.sequence, record.pinned)
        self._publish_event(runtime.name, {
            "event": "versions", "model": runtime.name, "action": move.action,
            "label": move.label, "version": move.version, "mode": move.mode,
            "labels": dict(record.labels), "default": record.default, "pinned": record.pinned,
            "sequence": record.sequence, "time": record.moved_at,
        })  # fmt: skip

    def _announce_held(self, runtime: ModelRuntime, record: ServingRecord) -> None:
        """At start: the payloads the restored record names go out again (a broker that lost
        its retained messages, a replica that starts later)."""
        assert runtime.publisher is not None and runtime.book is not None
        for version in record.versions:
            payload = runtime.book.file.load_held(version, record.versions[version])
            if payload is not None:
                runtime.publisher.publish_held(version, payload)
        runtime.held_published = set(record.versions)
        self.metrics.group(VersionRecordMetrics).held(runtime.name, record.sequence, record.pinned)

    def _record_moved(self, runtime: ModelRuntime) -> None:
        """The serving processes hear of a move (here: they are this process's endpoint)."""

    def _ingest_worker(self, runtime: ModelRuntime, route: Route) -> IngestWorker:
        assert runtime.connection is not None
        storage, wal = self.settings.storage, self.learner_log.wal
        worker = IngestWorker(
            runtime.connection,
            route,
            self.metrics,
            wal,
            storage.wal_group_max,
            commit_window_s=storage.wal_commit_window_ms / 1000.0 if wal is not None else 0.0,
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

    def report_drift(self, name: str, detections: int) -> None:
        """Count a detected drift and report it on the model's events topic."""
        self.metrics.group(TrainingStateMetrics).drift_detected.labels(model=name).inc()
        runtime = self.models.get(name)
        if runtime is None or runtime.trainer is None:
            return
        self._publish_event(name, {
            "event": "drift",
            "model": name,
            "detections": detections,
            "version": runtime.trainer.version,
            "samples_seen": runtime.trainer.samples_seen,
            "reaction": runtime.settings.drift.reaction,
            "time": time.time(),
        })  # fmt: skip

    def report_selection(self, name: str, switch: Switch, version: int) -> None:
        """Report a change of the served candidate on the model's events topic."""
        runtime = self.models.get(name)
        if runtime is None or runtime.trainer is None:
            return
        self._publish_event(name, {
            "event": "selection",
            "model": name,
            "served": switch.new,
            "previous": switch.old,
            "scores": {n: (v if math.isfinite(v) else None) for n, v in switch.scores.items()},
            "version": version,
            "samples_seen": runtime.trainer.samples_seen,
            "time": time.time(),
        })  # fmt: skip

    def _publish_event(self, name: str, event: dict[str, object]) -> None:
        """Publish ``event`` as JSON on the model's events topic (QoS 1), when the model has a
        broker connection."""
        runtime = self.models.get(name)
        if runtime is None or runtime.connection is None:
            return
        runtime.connection.publish(
            self.settings.events_topic(name), json.dumps(event).encode(), qos=1,
            content_type="application/json",
        )  # fmt: skip

    def weight_store(self, name: str) -> WeightStore | None:
        runtime = self.models.get(name)
        return runtime.store if runtime is not None else None

    def endpoints(self) -> dict[str, ModelEndpoint]:
        """The models the HTTP API answers for, by name."""
        return {name: m.endpoint for name, m in self.models.items() if m.endpoint is not None}

    def ready(self) -> bool:
        """True when every model is warmed up, connected, learning, and storage works."""
        return self.started and not self.problems()

    def problems(self) -> list[str]:
        """Why the learner is not ready, one line per problem (empty when ready)."""
        if not self.started:
            return ["starting"]
        found = list(self.storage_health.problems())
        for name, m in self.models.items():
            if m.connection is None:
                found.append(f"model {name}: not connected to the MQTT broker")
            elif (taken_over := m.connection.taken_over_reason()) is not None:
                found.append(f"model {name}: {taken_over}")
            elif not m.connection.connected.is_set():
                found.append(f"model {name}: {m.connection.not_connected_reason()}")
            if m.trainer is None or not m.trainer.running:
                found.append(f"model {name}: trainer not running")
            if m.ingest is not None and m.ingest.stalled():
                found.append(
                    f"model {name}: messages waiting over {m.settings.stall_after_s:g} s "
                    "and none accepted or rejected"
                )
        return found

    def stop(self) -> None:
        """Stop every part that started, in reverse order; safe to call more than once."""
        for runtime in self.models.values():
            if runtime.ingest is not None:
                runtime.ingest.stop()
                runtime.ingest = None
        for runtime in self.models.values():
            if runtime.trainer is not None:
                runtime.trainer.stop()
        for runtime in self.models.values():
            if runtime.guard is not None:  # before the publishers: its moves announce on them
                runtime.guard.stop()
                runtime.guard = None
            if runtime.publisher is not None:
                runtime.publisher.stop()
                runtime.publisher = None
            if runtime.endpoint is not None and runtime.endpoint.recorder is not None:
                runtime.endpoint.recorder.stop()
                runtime.endpoint.recorder = None
        for runtime in self.models.values():
            if runtime.connection is not None:
                runtime.connection.stop()
                runtime.connection = None
        self.learner_log.close()
        self.storage_watch.stop()
        if self.managed_broker is not None:
            self.managed_broker.stop()
            self.managed_broker = None
        self.storage_lock.release()
        self.started = False


class LearnerHooks(TrainerHooks):
    """What model ``runtime``'s trainer asks of the learner around it."""

    serving_here = True  # a one-process learner; a split learner's training process: below

    def __init__(self, learner: LearnerRuntime, runtime: ModelRuntime) -> None:
        self.learner = learner
        self.runtime = runtime

    def predictions_waiting(self) -> bool:
        endpoint = self.runtime.endpoint
        return endpoint is not None and endpoint.busy()

    def log_frontier(self, trained_position: int) -> int:
        return self.learner.learner_log.frontier(self.runtime.name, trained_position)

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

    def selection_switched(self, switch: Switch, version: int) -> None:
        self.learner.report_selection(self.runtime.name, switch, version)

    def batch_learned(self, batch: Batch, scored_by: int) -> None:
        guard = self.runtime.guard
        if guard is not None:
            guard.batch_scored(ScoredBatch(batch.x, batch.y, batch.w, scored_by))


def _remove_temporary_files(storage: Path) -> None:
    """Delete what an interrupted atomic write left (``*.tmp`` beside checkpoints and marks):
    only whole files are ever renamed into place, so nothing else reads them."""
    removed = 0
    for leftover in (storage / "checkpoints").glob("*/*.tmp"):
        leftover.unlink(missing_ok=True)
        removed += 1
    if removed:
        log.info("removed %d temporary files left by an interrupted write", removed)
