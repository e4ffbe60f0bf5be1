"""A small stand-in for a runtime (no broker, no trainer): one real ServingModel on a real
Keras model, whose snapshots and model calls a test controls."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from livefit.models.builders import build_model
from livefit.server.base.metrics import Metrics
from livefit.server.config.model import ModelSettings
from livefit.server.config.settings import Settings
from livefit.server.serve.endpoint import ModelEndpoint
from livefit.server.serve.serving import ServingModel
from livefit.server.weights.format import (
    WeightsMeta,
    architecture_fingerprint,
    encode_weights,
    sha256_hex,
)
from livefit.server.weights.store import EncodedWeights, WeightStore
from livefit.server.wire.snapshot import Snapshot, SnapshotSlot


class HeldServingModel(ServingModel):
    """A serving model whose calls wait until the test opens ``gate``."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def predict(self, rows: np.ndarray) -> tuple[np.ndarray, int]:
        self.entered.set()
        self.gate.wait(30)
        return super().predict(rows)


class StubRuntime:
    """One served model, no training: the app's Runtime protocol and nothing more."""

    role = "replica"
    wait_newer_weights_s = 0.0

    def __init__(self, http: dict[str, Any] | None = None) -> None:
        self.metrics = Metrics()
        self.settings = Settings.model_validate(
            {"http": http or {}, "models": {"m": {"input_shape": [2], "output_shape": [1]}}}
        )
        self.model_settings = ModelSettings.model_validate(
            {"builder": "linear", "input_shape": [2], "output_shape": [1],
             "serve": {"max_batch_size": 2, "batch_timeout_ms": 0, "max_queue_rows": 4}}
        )  # fmt: skip
        self.slot = SnapshotSlot()
        model = build_model("linear", [2], [1], seed=0)
        self.weights = tuple(np.asarray(w) for w in model.get_weights())
        self.serving = HeldServingModel(
            "m",
            model,
            [2],
            self.model_settings.serve.batch_sizes(),
            lambda: self.slot.latest,
            "/CPU:0",
        )
        self.store = WeightStore(keep=4)
        self._endpoints = {"m": ModelEndpoint("m", self.model_settings, self.serving)}

    def preflight(self) -> None:
        pass

    def start(self) -> None:
        self.serving.warm_up()

    def stop(self) -> None:
        pass

    def ready(self) -> bool:
        return self.slot.latest is not None

    def problems(self) -> list[str]:
        return [] if self.ready() else ["model m: no weights yet"]

    def endpoints(self) -> dict[str, ModelEndpoint]:
        return self._endpoints

    def weight_store(self, name: str) -> WeightStore | None:
        return self.store if name == "m" else None

    def publish(self, version: int) -> None:
        snapshot = Snapshot("m", version, self.weights, time.time(), 0)
        self.slot.publish(snapshot)
        self._endpoints["m"].snapshot_arrived()
        names = [f"w{i}" for i in range(len(self.weights))]
        meta = WeightsMeta("m", version, 0, snapshot.created_at, None,
                           architecture_fingerprint(names, self.weights))  # fmt: skip
        payload = encode_weights(names, self.weights, meta)
        self.store.add(EncodedWeights(version, payload, sha256_hex(payload), snapshot.created_at))
