"""``livefit serve`` with ``http.workers >= 1``: the learner split into one training process and
``http.workers`` serving processes behind one port, supervised by the ``livefit serve`` parent.

- The **training process** (``livefit serve`` again, told by ``LIVEFIT_TRAINING_DIR``) is the
  learner without its HTTP side: it locks the storage, ingests over MQTT, logs, trains,
  checkpoints and publishes weights on the weight topic. It also hands every snapshot, signed,
  to its own serving processes over a Unix socket (``server/weights/local_feed.py``) with its
  readiness, and answers its metrics on the group's metrics socket (``worker="training"``).
- Each **serving process** is the replica's serving half (``learner_serving.py``) fed by that
  socket instead of the broker: the prediction API, labels, the weights download, health,
  the dashboard and one ``/metrics`` for the whole group. While its batcher holds requests it
  says so on a shared-memory board (``server/serve/busy_board.py``) that the trainer reads
  to give way, as it does in one process.

Start: the parent binds the port (a taken port fails at once), starts the training process and
waits until it holds the storage lock (a second learner on the same storage fails before any
serving process starts or touches the broker), then starts the serving processes: they build
their models while the training process builds, restores and warms its own
(bench/results/start_time.json: ready about 2 s sooner than when they waited for its weight
feed), and serve once the feed brings them weights. Each process is forked from the group's
fork server, which imported TensorFlow once (``fork_server.py``, ``processes.preload``).
Stop (SIGTERM or SIGINT): the training process first (stop ingesting, train what was accepted,
checkpoint, publish: its serving processes get the final version), then the serving processes,
which drain their requests. A process that dies after it was ready is started again (the
serving processes keep serving the weights they hold while the training process restarts, and
say so on readiness), also when its replacement dies while starting; one that was never ready
since the group started (a bad key, a locked storage), or that dies more than ``MAX_RESTARTS``
times in ``RESTART_WINDOW_S``, ends the group with its status. No process outlives a SIGKILLed
parent (``children.py``).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..base.heartbeat import Silence, beat_file
from ..base.logs import TRAINING_ENV
from ..config.machine import serving_cpus
from ..config.sections import ProcessSettings
from ..config.settings import Settings
from ..serve.busy_board import BOARD_FILE, BusyBoard
from ..storage.lock import StorageLock
from ..weights.keys import learner_signing_key
from ..weights.local_feed import FEED_FILE
from .workers import (
    MAX_RESTARTS,
    RESTART_WINDOW_S,
    TRAINING,
    GroupMember,
    WorkerGroup,
    restarts_in_window,
    run_group,
    stop_saying,
)

log = logging.getLogger(__name__)
_TRAINING_DIR, _TRAINING_WORKERS = TRAINING_ENV, "LIVEFIT_TRAINING_WORKERS"
_TRAINING_PARENT = "LIVEFIT_TRAINING_PARENT"
LOCKED_FILE = "training.locked"
TRAINING_GRACE_S = 120.0  # the final training, checkpoint and publish of every model


def pin_serving_process(processes: ProcessSettings, serving_processes: int) -> list[int] | None:
    """Run this serving process of a split learner on the CPUs ``processes.serving_cores``
    gives it (beside ``serving_processes`` serving processes in all); the CPUs, or None where
    it keeps every CPU. Call before any thread starts (TensorFlow's pools among them): a new
    thread inherits its creator's mask. Best effort: logged and skipped where refused."""
    cpus = serving_cpus(processes.serving_cores, processes.training_cores, serving_processes)
    if cpus is None:
        return None
    try:
        os.sched_setaffinity(0, cpus)
    except (AttributeError, OSError) as exc:
        log.warning("could not pin the serving process to CPUs %s: %s", cpus, exc)
        return None
    log.info("serving process on CPUs %s (processes.serving_cores)", cpus)
    return cpus


@dataclass(frozen=True, slots=True)
class TrainingSlot:
    """Who the training process is: the group's directory, how many serving processes read
    its board, and the pid of the ``livefit serve`` parent (not always the training process's
    own parent: a fork server's child, ``processes.preload``)."""

    directory: Path
    workers: int
    parent: int = 0  # 0: this process's parent

    @classmethod
    def from_env(cls) -> TrainingSlot | None:
        if _TRAINING_DIR not in os.environ:
            return None
        parent = int(os.environ.get(_TRAINING_PARENT, "0"))
        return cls(Path(os.environ[_TRAINING_DIR]), int(os.environ[_TRAINING_WORKERS]), parent)

    def env(self) -> dict[str, str]:
        return {_TRAINING_DIR: str(self.directory), _TRAINING_WORKERS: str(self.workers),
                _TRAINING_PARENT: str(self.parent)}  # fmt: skip

    def parent_pid(self) -> int:
        """The ``livefit serve`` parent: a second learner on the same storage names it, since
        stopping it stops the learner (stopping this process would get it started again)."""
        return self.parent or os.getppid()

    def ready_marker(self) -> Path:
        """Exists once the training process feeds weights (``LocalWeightFeed.start``)."""
        return self.directory / FEED_FILE

    def locked_marker(self) -> Path:
        """Exists once the training process holds the storage lock: the serving processes
        may start."""
        return self.directory / LOCKED_FILE

    def lock_storage(self, settings: Settings) -> StorageLock:
        """The training process's first act, before it imports TensorFlow: lock the storage
        (naming the ``livefit serve`` parent as its holder), make the weight-signing keys
        (the serving processes wait for the public ones), then tell the parent, which starts
        the serving processes. Raises ``StorageLocked``, and ``ConfigError`` for a key."""
        storage = Path(settings.storage.dir)
        lock = StorageLock(storage).acquire(settings.http.port, self.parent_pid())
        for name, model in settings.models.items():
            learner_signing_key(model.weights, storage, name)
        self.locked_marker().touch()
        return lock

    def heartbeat_file(self) -> Path:
        """Touched by the training process's main thread while it runs (``heartbeat``)."""
        return beat_file(self.directory, TRAINING)

    def board(self, models: Sequence[str], create: bool = False) -> BusyBoard:
        return BusyBoard(self.directory / BOARD_FILE, self.workers, models, create=create)


class LearnerGroup(WorkerGroup):
    """The training process and the serving processes of one split learner."""

    def __init__(
        self, argv: Sequence[str], count: int, sock: socket.socket, models: Sequence[str],
        hang_timeout_s: float = 0.0, preload: bool = True,
    ) -> None:  # fmt: skip
        super().__init__(argv, count, sock, kind="learner", hang_timeout_s=hang_timeout_s,
                         preload=preload)  # fmt: skip
        self.slot = TrainingSlot(self.directory, count, os.getpid())
        self.board = self.slot.board(models, create=True)
        self.training = GroupMember(self.workers[0].slot)  # its slot is unused: only the record

    def close(self) -> None:
        self.board.close()

    def _start_training(self) -> None:
        self.slot.ready_marker().unlink(missing_ok=True)
        self.slot.locked_marker().unlink(missing_ok=True)
        self.slot.heartbeat_file().unlink(missing_ok=True)
        self.training.silence = Silence()
        env = {**os.environ, **self.slot.env()}
        self.training.process = self.launcher.start(self.argv, env)
        log.info("training process started (pid %d)", self.training.process.pid)

    def _start_all(self) -> int | None:
        self._start_training()
        process = self.training.process
        assert process is not None
        while not self.slot.locked_marker().exists():
            code = process.poll()
            if code is not None:
                log.error(
                    "the training process exited with status %d before it was ready; "
                    "stopping (its log lines above say why)",
                    code,
                )
                return code or 1
            if self.stopping.wait(0.05):
                return None
        count = len(self.workers)
        log.info("training process holds the storage; starting %d serving processes", count)
        return super()._start_all()

    def _check(self) -> int | None:
        process = self.training.process
        assert process is not None
        self.training.mark_served(self.slot.ready_marker().exists())
        code = process.poll()
        if code is None:
            self._kill_if_silent(self.training, self.slot.heartbeat_file(), "the training process")
        else:
            if self.training.dies_fatally():
                log.error("the training process exited with status %d before it was ready; "
                          "stopping", code)  # fmt: skip
                return code or 1
            if restarts_in_window(self.training.restarts, time.monotonic()) > MAX_RESTARTS:
                restarts = len(self.training.restarts)
                log.error("the training process died %d times in %.0f s (last status %d); "
                          "stopping", restarts, RESTART_WINDOW_S, code)  # fmt: skip
                return 1
            log.warning("the training process exited with status %d; starting it again (the "
                        "serving processes keep serving the weights they hold)", code)  # fmt: skip
            self.training.served = False
            self._start_training()
        return super()._check()

    def _stop(self) -> int:
        """The training process first (its final weights reach the serving processes), then
        the serving processes; 0 if all stopped cleanly."""
        training = self.training.process
        clean = True
        if training is not None:
            stop_saying([training], TRAINING_GRACE_S, f"the training process (pid {training.pid})",
                        "to train what it accepted, checkpoint and publish")  # fmt: skip
            clean = training.returncode in (0, -signal.SIGTERM)
        return max(super()._stop(), 0 if clean else 1)


def run_learner_group(
    argv: Sequence[str], count: int, host: str, port: int, models: Sequence[str],
    hang_timeout_s: float = 0.0, preload: bool = True,
) -> int:  # fmt: skip
    """Bind ``host:port``, run the split learner until SIGINT or SIGTERM; its exit status (a
    serving process silent for ``hang_timeout_s`` is killed and started again; 0: never; the
    processes forked from a fork server where ``preload``)."""
    describe = f"the learner (a training process and {count} serving processes)"
    return run_group(
        lambda sock: LearnerGroup(argv, count, sock, models, hang_timeout_s, preload),
        host, port, describe,
    )  # fmt: skip
