"""A split learner's training process: the learner without its HTTP side.

Everything ``LearnerRuntime`` does (storage lock, MQTT ingestion, write-ahead log, trainers,
checkpoints, the weight topic), minus the serving half: its models are served by the group's
serving processes (``learner_serving.py``), which it feeds every snapshot over the local weight
feed, and whose busy board its trainers read to give way to queued predictions. Every
``STATUS_INTERVAL_S`` it sends its readiness problems on the feed, and it answers its metrics on
the group's metrics socket (``worker="training"``). It runs on the cores the serving processes
leave it (``processes.training_cores``, ``pin_to_cpus``; TensorFlow's intra-op pool sized to
them), so that queued predictions find a core that training cannot take. SIGTERM, SIGINT or
SIGHUP stops it in the learner's order (stop ingesting, train what was accepted, checkpoint,
publish); exit 0 then, 2 when a check before start failed (the storage is locked by another
learner), 1 when a part could not start.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading

from prometheus_client import CollectorRegistry

from ..base.heartbeat import touch
from ..base.metrics_merge import WorkerMetrics
from ..config.machine import training_cpus
from ..config.model import ModelSettings
from ..config.settings import Settings
from ..serve.busy_board import BusyBoard
from ..serve.endpoint import ModelEndpoint
from ..storage.lock import StorageLock, StorageLocked
from ..train.hooks import TrainerHooks
from ..weights.local_feed import (
    STATUS_INTERVAL_S,
    STATUS_KEY,
    LocalWeightFeed,
    LocalWeightPublisher,
)
from ..wire.snapshot import SnapshotSlot
from .children import spawner_thread, start_spawner
from .control_socket import ControlServer
from .learner import LearnerHooks, LearnerRuntime, ModelRuntime
from .learner_group import TrainingSlot
from .stop_signals import on_stop_signals
from .workers import TRAINING

log = logging.getLogger(__name__)


class TrainingRuntime(LearnerRuntime):
    """The learner's background parts, serving through the group's serving processes."""

    def __init__(
        self,
        settings: Settings,
        slot: TrainingSlot,
        registry: CollectorRegistry | None = None,
        storage_lock: StorageLock | None = None,
    ) -> None:
        """``storage_lock``: the lock ``TrainingSlot.lock_storage`` took (None: taken by
        ``preflight``)."""
        super().__init__(settings, registry, slot.parent_pid(), storage_lock)
        self.slot = slot
        self.feed = LocalWeightFeed(slot.directory)
        self.board: BusyBoard | None = None
        self.local: dict[str, LocalWeightPublisher] = {}
        self.control = ControlServer(slot.directory, self.move)  # the serving processes' moves

    def _start(self) -> None:
        self.board = self.slot.board(list(self.settings.models))
        super()._start()
        for runtime in self.models.values():
            assert runtime.publisher is not None
            local = LocalWeightPublisher(self.feed, runtime.publisher)
            runtime.slot.subscribe(local.offer)
            local.start()
            if runtime.slot.latest is not None:
                local.offer(runtime.slot.latest)
            self.local[runtime.name] = local
        self.control.start()
        self.send_status()  # queued until the feed starts (run_training, at full priority)

    def _build_endpoint(
        self, name: str, settings: ModelSettings, device: str, slot: SnapshotSlot
    ) -> ModelEndpoint | None:
        return None

    def _hooks(self, runtime: ModelRuntime) -> TrainerHooks:
        return _TrainingHooks(self, runtime)

    def send_status(self) -> None:
        """Tell the serving processes why this learner is not ready (nothing when it is)."""
        body = json.dumps({"problems": self.problems()}).encode()
        self.feed.send(b"S", STATUS_KEY, body)

    def _record_moved(self, runtime: ModelRuntime) -> None:
        """The serving processes hear of a move on the feed: the newest sealed again."""
        local = self.local.get(runtime.name)
        if local is not None:
            local.resend()

    def stop(self) -> None:
        self.control.stop()
        super().stop()  # the trainers' final snapshots reach the local publishers here
        for local in self.local.values():
            local.stop()
        self.local.clear()
        self.feed.stop()
        if self.board is not None:
            self.board.close()
            self.board = None


class _TrainingHooks(LearnerHooks):
    """The learner's hooks; predictions wait when any serving process says so on the board."""

    serving_here = False  # the serving processes are others

    def __init__(self, training: TrainingRuntime, runtime: ModelRuntime) -> None:
        super().__init__(training, runtime)
        self.training = training

    def predictions_waiting(self) -> bool:
        board = self.training.board
        return board is not None and board.busy(self.runtime.name)


def lower_thread_priority(increment: int) -> None:
    """Add ``increment`` to the calling thread's niceness (Linux keeps it per thread, and a new
    thread inherits its creator's). Best effort: logged and skipped where refused."""
    if increment <= 0:
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + increment)
    except OSError as exc:
        log.warning("could not lower the training threads' priority: %s", exc)


def start_lowered(runtime: TrainingRuntime, increment: int) -> None:
    """``runtime.start()`` on a thread ``increment`` nicer than this one, so that every thread
    it starts (ingestion, the trainers and the pools of TensorFlow, whose context it creates,
    checkpoint writers, weight publishers) yields the cores to the serving processes. The
    calling thread keeps its priority, and with it the control plane it runs afterwards (the
    status it sends, the local feed, its metrics answers): a lowered process starved by other
    work on the machine would otherwise miss its status deadline and its metrics scrapes, and
    readiness would flap. The children ``start`` forks (a mosquitto for ``broker.url =
    "auto"``) are forked by the spawner thread (``children.start_child``: this thread ends
    once ``start`` returns, and a child's parent-death signal follows its forking thread),
    started here first so that they keep this thread's priority. Raises what ``start``
    raised."""
    failure: list[BaseException] = []

    def start() -> None:
        lower_thread_priority(increment)
        try:
            runtime.start()
        except BaseException as exc:  # handed to the caller
            failure.append(exc)

    start_spawner()
    starter = threading.Thread(target=start, name="livefit-training-start")
    starter.start()
    starter.join()
    if failure:
        raise failure[0]
    if increment > 0:
        log.info("training threads at niceness +%d (processes.training_niceness)", increment)


def cpus_for_training(settings: Settings, slot: TrainingSlot) -> list[int] | None:
    """The CPUs the training process runs on (``processes.training_cores`` beside the group's
    serving processes); None: every CPU."""
    return training_cpus(settings.processes.training_cores, slot.workers)


# The inter-op pool of a training process that trains one model on the CPU, unless
# ``tensorflow.inter_op_threads`` is set. It serves no predictions and runs one trainer, so
# nothing else waits on the pool. why: TensorFlow's default (one per core) leaves idle threads
# that compete with the trainer's own for the cores (BENCHMARKS.md#trainer-throughput, the side
# "default pools"). Intel's guidance for TensorFlow on CPUs likewise sets it to the sockets.
# Not taken with several models (their steps would share the one thread) or a GPU (not
# benchmarked); TensorFlow has open reports of hangs with one inter-op thread in TF1-style
# graphs (tensorflow#38969), none seen here.
TRAINING_INTER_OP_THREADS = 1


def size_training_pools(settings: Settings, slot: TrainingSlot) -> None:
    """Size TensorFlow's pools for the training process: the intra-op pool to its CPUs, unless
    ``tensorflow.intra_op_threads`` is set (more threads than cores only take turns on them);
    the inter-op pool to ``TRAINING_INTER_OP_THREADS`` where it trains one model on the CPU,
    unless ``tensorflow.inter_op_threads`` is set. Call before ``configure_tensorflow``."""
    cpus = cpus_for_training(settings, slot)
    if cpus is not None and not settings.tensorflow.intra_op_threads:
        settings.tensorflow.intra_op_threads = len(cpus)
    if not settings.tensorflow.inter_op_threads and trains_one_model_on_the_cpu(settings):
        settings.tensorflow.inter_op_threads = TRAINING_INTER_OP_THREADS


def trains_one_model_on_the_cpu(settings: Settings) -> bool:
    """One model, on no GPU: none named in ``tensorflow.devices`` or the model's ``device``, and
    none visible for ``"auto"`` (listing the devices leaves TensorFlow's pools unset)."""
    if len(settings.models) != 1:
        return False
    devices = settings.tensorflow.devices
    if devices != "auto" and any("GPU" in name.upper() for name in devices):
        return False
    (model,) = settings.models.values()
    from ..train.modeling import resolve_device  # TensorFlow: imported only when asked

    return "GPU" not in resolve_device(model.device).upper()


def pin_to_cpus(cpus: list[int] | None) -> None:
    """Run every thread of this process on ``cpus`` (Linux keeps the mask per thread and a new
    thread inherits its creator's), except the spawner thread, whose children (a broker) keep
    every CPU. Best effort: logged and skipped where refused or not Linux."""
    if cpus is None:
        return
    keep = spawner_thread().native_id
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError as exc:
        log.warning("could not pin the training process to CPUs %s: %s", cpus, exc)
        return
    for tid in threads:
        if tid == keep:
            continue
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
        except (AttributeError, OSError) as exc:
            log.warning("could not pin the training process to CPUs %s: %s", cpus, exc)
            return
    log.info("training process on CPUs %s (processes.training_cores)", cpus)


def run_training(
    settings: Settings, slot: TrainingSlot, storage_lock: StorageLock | None = None
) -> int:
    """Run the training process until SIGTERM, SIGINT or SIGHUP; its exit status.
    ``storage_lock``: the storage lock, where it was taken before TensorFlow was imported."""
    runtime = TrainingRuntime(settings, slot, storage_lock=storage_lock)
    stopping = threading.Event()

    def stop(signum: int, _frame: object) -> None:
        log.info("%s: stopping the training process", signal.Signals(signum).name)
        stopping.set()

    on_stop_signals(stop)  # SIGTERM, SIGINT, SIGHUP (stop_signals.py)
    try:
        runtime.preflight()
    except StorageLocked as exc:
        runtime.stop()
        print(f"livefit: {exc}", file=sys.stderr)
        return 2
    pin_to_cpus(cpus_for_training(settings, slot))
    try:
        start_lowered(runtime, settings.processes.training_niceness)
    except Exception:
        log.exception("the training process could not start")
        return 1
    runtime.feed.start()  # the serving processes get their first weights and status from here
    metrics = WorkerMetrics(runtime.metrics.registry, TRAINING, (), slot.directory)
    metrics.start()
    log.info("training process ready: %s", ", ".join(runtime.models))
    beat = slot.heartbeat_file()
    touch(beat)
    try:
        while not stopping.wait(STATUS_INTERVAL_S):
            runtime.send_status()
            touch(beat)
    finally:
        metrics.stop()
        runtime.stop()
    log.info("training process stopped; exiting")
    return 0
