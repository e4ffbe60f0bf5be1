"""A replica: the serving half of livefit, fed by the weight stream instead of a trainer.

Same config file, same prediction API, batcher and limits as the learner; no training. Each
model's weights arrive on its weight topic (retained, so a replica started late gets the
newest at once), are verified by a ``WeightReceiver`` (the learner's Ed25519 signature, see
``weights.keys``) and swapped in between batches. A replica is ready only once every model holds
a version. Without a key to verify weights with (and without ``weights.allow_unsigned``) a
replica does not start: it says which setting is missing before it connects anywhere.

A replica builds each network from its own config, as the learner does, and refuses weights of
another architecture (``wrong_architecture``); it does not build networks from the weight
stream's descriptions (a ``WeightSubscriber`` does). When the learner describes another network
of the same weight shapes (another activation, say), the replica serves its config's and says
so once in a warning.

One replica may follow models of several learners (docs/fleet.md): everything about a model's
weights is per model (topic, key, pull URL and token), so each is verified with its own
learner's key and pulled from its own learner.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from livefit.models.builders import weight_names

from ..base.clocks import ahead_s
from ..base.metrics import ClockMetrics, Metrics
from ..config.broker_urls import BrokerAddress
from ..config.model import ModelSettings
from ..config.sections import BrokerSettings
from ..config.settings import ConfigError, Settings
from ..http.admin_api import VersionControl
from ..http.auth import TokenGuard
from ..labels.recorder import recorder_for
from ..mqtt.probe import for_broker
from ..serve.endpoint import ModelEndpoint
from ..serve.metrics import ServingMetrics, VersionRecordMetrics
from ..serve.version_book import describe
from ..storage.health import LogLimiter
from ..train.modeling import enable_gpu_memory_growth, network_description, resolve_device
from ..weights.format import architecture_fingerprint, description_sha256, sha256_hex
from ..weights.metrics import FreshnessMetrics, WeightsReceivedMetrics
from ..weights.receiver import WeightReceiver
from ..weights.receiver_auth import Authenticator, receiver_authenticator
from ..weights.store import EncodedWeights, WeightStore
from ..weights.verifier import OUTCOMES, ReceivedWeights, WeightVerifier
from ..weights.version_log import VersionLog
from ..wire.serving_record import ServingRecord
from ..wire.snapshot import Snapshot, SnapshotSlot
from .broker import resolve_broker
from .process_runtime import build_endpoint, start_all_or_none

log = logging.getLogger(__name__)


@dataclass
class ReplicaModel:
    """One model on a replica: where its weights come from and how it is served."""

    name: str
    settings: ModelSettings
    slot: SnapshotSlot
    endpoint: ModelEndpoint
    store: WeightStore
    receiver: WeightVerifier | None = None  # a WeightReceiver on a replica
    description_sha256: str = ""  # of the network this config builds ("": not describable)


class ReplicaRuntime:
    """Receives weights for every configured model and serves them."""

    role = "replica"
    wait_newer_weights_s = 0.0  # pulls for a version not held are 404 at once
    # Labels and pins are moved on the learner and arrive signed: a replica's admin moves are 409
    version_control: VersionControl | None = None

    def __init__(
        self, settings: Settings, registry: CollectorRegistry | None = None, instance: str = ""
    ) -> None:
        self.settings = settings
        self.metrics = Metrics(registry, role=self.role)
        self.started = False
        self.instance = instance or f"{socket.gethostname()}-{settings.http.port}"
        self.models: dict[str, ReplicaModel] = {}
        self._version_logs: dict[str, VersionLog] = {}
        self._clock_log = LogLimiter(60.0)  # snapshots dated ahead of this clock
        self._warned_descriptions: set[str] = set()

    def start(self) -> None:
        """Start every part; raises (after stopping what did start) if a part cannot start."""
        start_all_or_none(self._start, self.stop)
        self.started = True

    def _start(self) -> None:
        self._build_models()
        auth = self._authenticators()  # a missing key fails here, before any connection
        storage = Path(self.settings.storage.dir)
        nodes, _ = resolve_broker(self.settings.broker.url, storage, allow=("existing",))
        broker = for_broker(nodes, self.settings.broker)  # the learner's protocol, found
        for replica_model in self.models.values():
            replica_model.receiver = self._receiver(
                replica_model, nodes, broker, auth[replica_model.name]
            )
            replica_model.receiver.start()
            replica_model.endpoint.recorder = recorder_for(
                self.settings, replica_model.name, nodes, self.metrics,
                f"{self.settings.broker.client_id}-replica-{self.instance}-"
                f"{replica_model.name}-predictions", broker.protocol,
            )  # fmt: skip
        deadline = time.monotonic() + self.settings.broker.connect_timeout_s
        for replica_model in self.models.values():
            assert replica_model.receiver is not None
            if not replica_model.receiver.connected.wait(max(0.0, deadline - time.monotonic())):
                log.warning(
                    "replica not connected to %s yet; retrying in the background",
                    ", ".join(str(node) for node in nodes),
                )
                break

    def _build_models(self) -> None:
        """Every configured model, built and warmed (GPU memory grown as needed, not taken
        whole: a learner or other processes may share the GPU)."""
        enable_gpu_memory_growth()
        self.metrics.watch_gpus()
        for name, model_settings in self.settings.models.items():
            self.models[name] = self._build(name, model_settings)

    def _build(self, name: str, settings: ModelSettings) -> ReplicaModel:
        device = resolve_device(settings.device)
        self.metrics.init_model(name)
        self.metrics.group(ServingMetrics)
        self.metrics.group(WeightsReceivedMetrics)
        self.metrics.group(FreshnessMetrics)
        self.metrics.group(VersionRecordMetrics).init_model(name)
        for outcome in OUTCOMES:
            self.metrics.group(WeightsReceivedMetrics).weights_received.labels(
                model=name, outcome=outcome
            )
        slot = SnapshotSlot()
        endpoint = build_endpoint(
            name, settings, device, slot, lambda snapshot: self._swapped(name, snapshot),
            self._checkpoints(name),
        )  # fmt: skip
        serving = endpoint.serving
        slot.subscribe(endpoint.snapshot_arrived)
        age = self.metrics.group(WeightsReceivedMetrics).weights_age.labels(model=name)
        # the learner's clock stamped created_at: never a negative age (_swapped counts those)
        age.set_function(
            lambda: max(0.0, time.time() - serving.snapshot.created_at) if serving.snapshot else 0.0
        )
        self.metrics.group(ClockMetrics).clock_ahead.labels(model=name, source="snapshot")
        self.metrics.model_ready.labels(model=name).set(1)
        description = network_description(serving.model, settings)
        return ReplicaModel(
            name, settings, slot, endpoint, WeightStore(settings.weights.keep_versions),
            description_sha256=description_sha256(description),
        )  # fmt: skip

    def _checkpoints(self, name: str) -> Path | None:
        """Where model ``name``'s checkpoints are to serve as past versions: nowhere for a
        replica (its learner's disk is elsewhere, or another learner's)."""
        return None

    def _authenticators(self) -> dict[str, Authenticator]:
        """Each model's verification policy; ConfigError (logged) names what to set."""
        found = {}
        for name in self.settings.models:
            wait_s = self.settings.broker.connect_timeout_s  # for a learner starting beside us
            try:
                found[name] = receiver_authenticator(self.settings, name, wait_s)
            except ConfigError as exc:
                log.error("replica cannot start: %s", exc)
                raise
            log.info("weights of %s are verified with %s; large ones pulled from %s",
                     name, found[name].describe, self._pull_origin(name))  # fmt: skip
        return found

    def _pull_origin(self, name: str) -> str:
        """Where ``name``'s manifests are pulled from, and with which token (for the log)."""
        weights = self.settings.models[name].weights
        url = weights.pull_url or self.settings.http.public_url
        if url is None:
            return "nowhere (no weights.pull_url: manifests are refused)"
        if weights.pull_token is not None:
            return f"{url} (token: models.{name}.weights.pull_token)"
        return f"{url} (token: {'http.token' if self.settings.http.token else 'none'})"

    def _receiver(
        self, replica_model: ReplicaModel, nodes: Sequence[BrokerAddress], broker: BrokerSettings,
        auth: Authenticator,
    ) -> WeightReceiver:  # fmt: skip
        weights = replica_model.settings.weights
        return WeightReceiver(
            nodes,
            **self._verification(replica_model, auth),
            broker=broker,
            client_id=f"{broker.client_id}-replica-{self.instance}-{replica_model.name}",
            # Pulls go to the learner this model is configured for (each model may follow
            # another learner), never to a URL a message names; the bearer token goes only there.
            pull_url=weights.pull_url or self.settings.http.public_url,
            pull_timeout_s=weights.pull_timeout_s,
            on_held=replica_model.endpoint.versions.held_arrived,
        )

    def _verification(self, replica_model: ReplicaModel, auth: Authenticator) -> dict[str, Any]:
        """What a verifier of ``replica_model``'s weights needs, whatever carries them."""
        name = replica_model.name
        model = replica_model.endpoint.serving.model
        names = weight_names(model)
        counter = self.metrics.group(WeightsReceivedMetrics).weights_received
        weights = replica_model.settings.weights
        return {
            "model": name,
            "topic": self.settings.weights_topic(name),
            "fingerprint": architecture_fingerprint(names, model.get_weights()),
            "on_weights": lambda received: self._received(replica_model, received),
            "auth": auth,
            "on_outcome": lambda outcome: counter.labels(model=name, outcome=outcome).inc(),
            # Each model's learner may have its own token; the default is this process's.
            "pull_headers": TokenGuard(
                weights.pull_token_bytes() or self.settings.http.token_bytes()
            ).headers(),
            "max_pull_bytes": weights.max_pull_bytes,
            "max_age_s": weights.max_age_s,
            "refused_unready_s": weights.refused_unready_s,
            "on_record": lambda text: self._record_arrived(replica_model, text),
        }

    def _record_arrived(self, replica_model: ReplicaModel, text: str) -> None:
        """The learner's serving record, verified with its weights: serve by it when newer."""
        record = ServingRecord.decode(text)
        if replica_model.endpoint.versions.apply(record):
            self.metrics.group(VersionRecordMetrics).held(
                replica_model.name, record.sequence, record.pinned
            )
            log.info("model %s: serving record %d: %s", replica_model.name, record.sequence,
                     describe(record))  # fmt: skip

    def _received(self, replica_model: ReplicaModel, received: ReceivedWeights) -> None:
        meta = received.meta
        self._compare_description(replica_model, meta.description)
        replica_model.store.add(
            EncodedWeights(
                meta.version,
                received.payload,
                sha256_hex(received.payload),
                meta.created_at,
                meta.lineage,
                received.envelope,
            )
        )
        replica_model.slot.publish(
            Snapshot(
                model=replica_model.name,
                version=meta.version,
                weights=tuple(received.arrays),
                created_at=meta.created_at,
                samples_seen=meta.samples_seen,
                newest_published_at=meta.newest_published_at,
                lineage=meta.lineage,
            )
        )

    def _compare_description(self, replica_model: ReplicaModel, description: str) -> None:
        """Warn (once per description) when the learner describes another network than this
        config builds: same weight shapes (the fingerprint matched), another function, e.g. an
        activation. The replica serves its own config's network, as it always has."""
        theirs, ours = description_sha256(description), replica_model.description_sha256
        if not theirs or not ours or theirs == ours or theirs in self._warned_descriptions:
            return
        self._warned_descriptions.add(theirs)
        log.warning(
            "model %s: the learner's network differs from the one this config builds (same "
            "weight shapes; description %s, this config's %s): predictions may differ from the "
            "learner's. Give the replica the learner's model settings (GET "
            "/v1/models/%s/description on the learner shows its network)",
            replica_model.name, theirs[:12], ours[:12], replica_model.name,
        )  # fmt: skip

    def _swapped(self, name: str, snapshot: Snapshot) -> None:
        self.metrics.group(ServingMetrics).serving_version.labels(model=name).set(snapshot.version)
        ahead = ahead_s(snapshot.created_at, time.time())
        if ahead:
            self.metrics.group(ClockMetrics).clock_ahead.labels(model=name, source="snapshot").inc()
            if self._clock_log.allow(name) is not None:
                log.warning(
                    "%s v%d was made %.0f s ahead of this replica's clock (the learner's clock "
                    "is ahead, or was stepped); its age reads 0 until it is older",
                    name, snapshot.version, ahead,
                )  # fmt: skip
        if snapshot.newest_published_at is not None:
            freshness = max(0.0, time.time() - snapshot.newest_published_at)
            self.metrics.group(FreshnessMetrics).freshness.labels(
                model=name, stage="served"
            ).observe(freshness)
        versions = self._version_logs.get(name)
        if versions is None:
            versions = self._version_logs.setdefault(name, VersionLog(log, name, "served"))
        versions.record(snapshot.version, f"{name} now serves version {snapshot.version}")

    def preflight(self) -> None:
        """Nothing to check before the socket is bound: a replica holds no storage lock."""

    def ready(self) -> bool:
        """Connected to the weight stream and holding a version of every model."""
        return self.started and not self.problems()

    def problems(self) -> list[str]:
        """Why the replica is not ready, one line per problem (empty when ready)."""
        if not self.started:
            return ["starting"]
        found = []
        for name, m in self.models.items():
            receiver = m.receiver
            if receiver is None:
                found.append(f"model {name}: not connected to the MQTT broker")
                continue
            if not receiver.connected.is_set():
                found.append(f"model {name}: {receiver.not_connected_reason()}")
            if m.slot.latest is None:
                refused = f"; refused: {receiver.last_refused}" if receiver.last_refused else ""
                found.append(
                    f"model {name}: no weights yet on {receiver.topic} (is a learner for this "
                    f"model running on this broker?){refused}"
                )
            elif (refusing := receiver.refusal_problem()) is not None:
                found.append(f"model {name}: {refusing}")
        return found

    def endpoints(self) -> dict[str, ModelEndpoint]:
        """The models the HTTP API answers for, by name."""
        return {name: m.endpoint for name, m in self.models.items()}

    def weight_store(self, name: str) -> WeightStore | None:
        replica_model = self.models.get(name)
        return replica_model.store if replica_model is not None else None

    def stop(self) -> None:
        for replica_model in self.models.values():
            if replica_model.receiver is not None:
                replica_model.receiver.stop()
                replica_model.receiver = None
            if replica_model.endpoint.recorder is not None:
                replica_model.endpoint.recorder.stop()
                replica_model.endpoint.recorder = None
        for versions in self._version_logs.values():
            versions.flush()
        self.started = False
