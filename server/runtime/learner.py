"""The learner process's background parts, started and stopped together in a fixed order.

Preflight (before anything touches storage or the broker): lock the storage directory, remove
temporary files a crash left. Start: broker (resolve, maybe launch) -> models built, restored
from their newest checkpoint and warmed -> weight publishers -> trainers -> replay of the
write-ahead log past each checkpoint -> one ingest worker and one MQTT session per model ->
connect. Stop: ingest (nothing new is accepted; what was not acknowledged stays with the
broker) -> trainers (train what was accepted, final snapshot, final checkpoint) -> weight
publishers (the final snapshot goes out) -> MQTT -> the log -> the broker livefit launched ->
the storage lock.

Each model has its own MQTT session (client id ``<broker.client_id>-<model>``), receive window
and ingest worker: a model whose trainer cannot keep up holds back only its own stream, and the
others keep their latency. All models share one write-ahead log.

This module owns that order (``LearnerRuntime``) and readiness; what each model runs and how
it is built is ``learner_models``' (``ModelRuntime``, ``LearnerHooks``, re-exported here), the
log's replay and truncation ``learner_log``'s.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from ..config.settings import Settings
from ..ingest.route import Route
from ..labels.recorder import recorder_for
from ..mqtt.broker import BrokerAddress
from ..mqtt.connection import MqttConnection
from ..mqtt.probe import for_broker
from ..serve.serving import ServedModel
from ..storage.health import StorageHealth
from ..storage.lock import StorageLock
from ..storage.wal import WriteAheadLog
from ..storage.watch import StorageWatch
from ..train.metrics import TrainingStateMetrics
from ..train.modeling import enable_gpu_memory_growth
from ..weights.store import WeightStore
from .broker import ManagedBroker, resolve_broker
from .learner_log import LearnerLog, _remove_temporary_files
from .learner_models import LearnerModels, ModelRuntime
from .process_runtime import ProcessRuntime

log = logging.getLogger(__name__)


class LearnerRuntime(LearnerModels, LearnerLog, ProcessRuntime):
    """Owns the broker connection, the ingest worker and one trainer per model."""

    role = "learner"
    lock_owner_pid: int | None = None  # the storage lock names this pid (None: this process)

    def __init__(self, settings: Settings, registry: CollectorRegistry | None = None) -> None:
        super().__init__(settings, registry)
        self.models: dict[str, ModelRuntime] = {}
        self.managed_broker: ManagedBroker | None = None
        self.wal: WriteAheadLog | None = None
        self.storage_lock = StorageLock(Path(settings.storage.dir))
        self.storage_health = StorageHealth(self.metrics)
        self.storage_watch = StorageWatch(
            self.storage_lock, self.storage_health, self._storage_lost
        )

    def preflight(self) -> None:
        """The cheap checks that must pass before anything else starts: raises
        ``StorageLocked`` naming the other process when the storage dir is in use."""
        self.storage_lock.acquire(self.settings.http.port, self.lock_owner_pid)
        _remove_temporary_files(Path(self.settings.storage.dir))

    def _start(self) -> None:
        storage = Path(self.settings.storage.dir)
        self.preflight()
        address, self.managed_broker = resolve_broker(self.settings.broker.url, storage)
        enable_gpu_memory_growth()
        self.metrics.watch_gpus()
        if self.settings.storage.wal:
            self.wal = WriteAheadLog(
                storage / "wal",
                self.settings.storage.wal_segment_bytes,
                self.settings.storage.fsync,
            )
        for name, model_settings in self.settings.models.items():
            self.models[name] = self._build_model(name, model_settings, storage)
        if self.wal is not None:
            restored = [m.trainer.trained_position for m in self.models.values() if m.trainer]
            self.wal.open(start_after=max(restored, default=0))
        self.storage_watch.start()
        routes = self._sessions(address)
        for runtime in self.models.values():
            assert runtime.connection is not None
            self._start_weight_stream(runtime, runtime.connection)
        for runtime in self.models.values():
            assert runtime.trainer is not None
            runtime.trainer.start()
        self._replay(routes)
        for runtime in self.models.values():
            assert runtime.ingest is not None and runtime.connection is not None
            runtime.ingest.start()
            runtime.connection.start()
        deadline = time.monotonic() + self.settings.broker.connect_timeout_s
        for runtime in self.models.values():
            assert runtime.connection is not None
            if not runtime.connection.wait_connected(max(0.0, deadline - time.monotonic())):
                log.warning("not connected to %s yet; paho keeps retrying", address)
                break

    def _sessions(self, address: BrokerAddress) -> list[Route]:
        """One MQTT session per model (samples, labels and predictions subscribed), with its
        ingest route and worker, and its prediction recorder where it serves here."""
        protocol = self.managed_broker.protocol if self.managed_broker else None
        broker = for_broker(address, self.settings.broker, protocol)
        routes = []
        for name, runtime in self.models.items():
            runtime.connection = MqttConnection(
                address, broker, self.metrics,
                client_id=f"{self.settings.broker.client_id}-{name}",
            )  # fmt: skip
            subscription = self.settings.samples_topic(name)
            runtime.connection.add_subscription(subscription, qos=1)
            runtime.connection.add_subscription(self.settings.labels_topic(name), qos=1)
            runtime.connection.add_subscription(self.settings.predictions_topic(name), qos=1)
            route = self._route(runtime, subscription)
            routes.append(route)
            if runtime.served is not None:  # a split learner serves from other processes
                runtime.served.recorder = recorder_for(
                    self.settings, name, address, self.metrics,
                    f"{self.settings.broker.client_id}-{name}-predictions", broker.protocol,
                )  # fmt: skip
            runtime.ingest = self._ingest_worker(runtime, route)
        return routes

    def report_drift(self, name: str, detections: int) -> None:
        """Count a detected drift and report it on the model's events topic."""
        self.metrics.group(TrainingStateMetrics).drift_detected.labels(model=name).inc()
        runtime = self.models.get(name)
        connection = runtime.connection if runtime is not None else None
        if connection is None or runtime is None or runtime.trainer is None:
            return
        event = {
            "event": "drift",
            "model": name,
            "detections": detections,
            "version": runtime.trainer.version,
            "samples_seen": runtime.trainer.samples_seen,
            "reaction": runtime.settings.drift.reaction,
            "time": time.time(),
        }
        connection.publish(
            self.settings.events_topic(name), json.dumps(event).encode(), qos=1,
            content_type="application/json",
        )  # fmt: skip

    def _storage_lost(self, reason: str) -> None:
        """The storage dir was deleted or replaced (``storage.watch``): the log takes nothing
        more, so nothing more is acknowledged."""
        if self.wal is not None:
            self.wal.mark_lost(reason)

    def weight_store(self, name: str) -> WeightStore | None:
        runtime = self.models.get(name)
        return runtime.store if runtime is not None else None

    def served(self) -> dict[str, ServedModel]:
        """The models the prediction API answers for."""
        return {name: m.served for name, m in self.models.items() if m.served is not None}

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
            if runtime.publisher is not None:
                runtime.publisher.stop()
                runtime.publisher = None
            if runtime.served is not None and runtime.served.recorder is not None:
                runtime.served.recorder.stop()
                runtime.served.recorder = None
        for runtime in self.models.values():
            if runtime.connection is not None:
                runtime.connection.stop()
                runtime.connection = None
        if self.wal is not None:
            self.wal.close()
            self.wal = None
        self.storage_watch.stop()
        if self.managed_broker is not None:
            self.managed_broker.stop()
            self.managed_broker = None
        self.storage_lock.release()
        self.started = False
