"""A split learner's serving process: the replica's serving half, fed by the training process.

The same models, batcher, prediction and labels API, weights download and verification as a
replica (``replica.py``); the weights come over the group's local feed (``local_feed.py``)
instead of the broker, and are verified with the learner's public key like any others. It is
ready once the feed is connected, every model holds a version, and the training process
reports itself ready (its problems are listed as ``training: ...``). While its batcher holds
requests for a model it marks the group's busy board, so the trainer gives way.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from ..config.settings import Settings
from ..labels.recorder import recorder_for
from ..mqtt.probe import for_broker
from ..serve.busy_board import BusyBoard
from ..weights.local_feed import LocalWeightSource
from ..weights.receiver_auth import Authenticator
from ..weights.verifier import WeightVerifier
from .broker import resolve_broker
from .control_socket import ControlClient
from .learner_group import TrainingSlot
from .process_runtime import checkpoint_directory
from .replica import ReplicaModel, ReplicaRuntime
from .workers import WorkerSlot

log = logging.getLogger(__name__)
STATUS_STALE_S = 5.0  # no status from the training process for this long: say so
FRAME_OVERHEAD_BYTES = 1 << 20  # the envelope around a payload of max_pull_bytes
# A pull of a version newer than any held waits this long for it (weights_api.py): the weight
# topic's manifest can reach a replica before the local feed brings the version here.
WAIT_NEWER_WEIGHTS_S = 5.0


class LearnerServingRuntime(ReplicaRuntime):
    """Serving process ``slot.index`` of a split learner."""

    role = "learner"
    wait_newer_weights_s = WAIT_NEWER_WEIGHTS_S

    def __init__(
        self, settings: Settings, slot: WorkerSlot, registry: CollectorRegistry | None = None
    ) -> None:
        super().__init__(
            settings, registry, f"{socket.gethostname()}-{settings.http.port}-w{slot.index}"
        )
        self.slot = slot
        self.training = TrainingSlot(slot.directory, slot.count)
        self.version_control = ControlClient(slot.directory)  # moves go to the training process
        self.source: LocalWeightSource | None = None
        self.board: BusyBoard | None = None
        self._training_problems: list[str] = ["training: no word from the training process yet"]
        self._status_at = time.monotonic()

    def _start(self) -> None:
        self._build_models()  # GPU memory grown as needed: the training process shares it
        auth = self._authenticators()
        self.board = self.training.board(list(self.models))
        self.board.claim(self.slot.index)
        for replica_model in self.models.values():
            replica_model.receiver = self._verifier(replica_model, auth[replica_model.name])
            replica_model.receiver.start()
            replica_model.endpoint.on_queue_change = self._marker(replica_model.name)
        self.source = LocalWeightSource(
            self.training.ready_marker(),
            {name: m.receiver.submit for name, m in self.models.items() if m.receiver},
            self._training_status,
            max(m.settings.weights.max_pull_bytes for m in self.models.values())
            + FRAME_OVERHEAD_BYTES,
        )
        self.source.start()
        self._start_recorders()

    def _checkpoints(self, name: str) -> Path | None:
        """The training process's checkpoints of ``name`` (the same storage dir) serve as past
        versions here too."""
        return checkpoint_directory(Path(self.settings.storage.dir), name)

    def _marker(self, name: str) -> Callable[[int], None]:
        board, index = self.board, self.slot.index
        assert board is not None

        def queue_changed(rows: int) -> None:
            board.set(index, name, rows > 0)

        return queue_changed

    def _start_recorders(self) -> None:
        """Prediction records go over MQTT as on any serving process (delayed labels)."""
        storage = Path(self.settings.storage.dir)
        nodes, _ = resolve_broker(self.settings.broker.url, storage, allow=("existing",))
        broker = for_broker(nodes, self.settings.broker)
        for replica_model in self.models.values():
            replica_model.endpoint.recorder = recorder_for(
                self.settings, replica_model.name, nodes, self.metrics,
                f"{self.settings.broker.client_id}-{replica_model.name}-predictions-"
                f"w{self.slot.index}", broker.protocol,
            )  # fmt: skip

    def _verifier(self, replica_model: ReplicaModel, auth: Authenticator) -> WeightVerifier:
        """The replica's verification, fed by the local feed (nothing is ever pulled)."""
        return WeightVerifier(**self._verification(replica_model, auth))

    def _training_status(self, status: dict[str, object]) -> None:
        problems = status.get("problems")
        found = [str(p) for p in problems] if isinstance(problems, list) else ["bad status"]
        self._training_problems = [f"training: {p}" for p in found]
        self._status_at = time.monotonic()

    def problems(self) -> list[str]:
        """Why this serving process is not ready: its own reasons and the training process's."""
        if not self.started:
            return ["starting"]
        source = self.source
        if source is None or not source.connected.is_set():
            reason = source.last_error if source is not None else "not started"
            found = [f"training process: its weight feed is not connected ({reason})"]
        else:
            found = list(self._training_problems)
            silent = time.monotonic() - self._status_at
            if silent > STATUS_STALE_S:
                found.append(f"training process: no status for {silent:.0f} s")
        for name, m in self.models.items():
            if m.slot.latest is None:
                refused = m.receiver.last_refused if m.receiver is not None else None
                found.append(
                    f"model {name}: no weights yet from the training process"
                    + (f"; refused: {refused}" if refused else "")
                )
            elif m.receiver is not None and (refusing := m.receiver.refusal_problem()):
                found.append(f"model {name}: {refusing}")
        return found

    def stop(self) -> None:
        if self.source is not None:
            self.source.stop()
            self.source = None
        super().stop()
        if self.board is not None:
            self.board.claim(self.slot.index)
            self.board.close()
            self.board = None
