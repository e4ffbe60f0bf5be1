"""``livefit serve --workers 2``: a training process and two serving processes behind one port,
as real processes with a real mosquitto, attacked as README's guarantees say they hold.

- Every sample trains once in the training process; both serving processes serve its versions
  (fed over the local socket, verified with the learner's key); one ``/metrics`` answers for the
  three processes and the dashboard reads the group's figures.
- SIGKILL of each process kind: a serving process comes back while the other serves; the
  training process comes back, the serving processes keep answering with the weights they hold
  and readiness says the training side is down meanwhile; no acknowledged sample is lost.
- SIGTERM stops the training process first (every accepted sample trained and checkpointed,
  also the messages backpressure held after they were acknowledged) and the group exits 0; a
  SIGKILLed parent takes every process with it.
- A second split learner on the same storage exits 2 before any serving process starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from livefit.local_servers import LivefitProcess
from livefit.server.config.machine import training_cpus
from livefit.server.runtime.fork_server import FORK_SERVER_NAME
from livefit.server.runtime.local_process import free_port, quiet_env
from livefit.server.runtime.mosquitto import Mosquitto
from tests.configs import SMALL_MLP, learner_config, model
from tests.e2e.test_replica_workers import per_worker, predict_on_new_connections
from tests.e2e.test_weight_stream import config, publish_samples
from tests.layouts import with_workers
from tests.procfs import children, group_processes, process_name, training_process


def split_config(broker: Mosquitto, storage: Path) -> str:
    return with_workers(config(broker, storage), 2)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    mosquitto = Mosquitto(tmp_path_factory.mktemp("group-broker")).start()
    try:
        yield mosquitto
    finally:
        mosquitto.stop()


def trained(learner: LivefitProcess) -> float:
    return learner.metric("livefit_train_samples_total", model="demo", worker="training")


def wait_trained(learner: LivefitProcess, count: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while (seen := trained(learner)) < count:
        assert time.monotonic() < deadline, f"trained {seen} of {count}:\n{learner.tail(40)}"
        time.sleep(0.2)
    assert seen == count, f"trained {seen}, published {count}"


def wait_lineage(learner: LivefitProcess, count: int, timeout: float = 120) -> None:
    """Wait until the model's lineage holds ``count`` samples, then check it holds each once."""
    deadline = time.monotonic() + timeout
    while (lineage := learner.metric("livefit_model_samples", model="demo")) < count:
        assert time.monotonic() < deadline, f"{lineage} of {count}:\n{learner.tail(40)}"
        time.sleep(0.2)
    time.sleep(0.5)
    assert learner.metric("livefit_model_samples", model="demo") == count


def wait_both_serve(learner: LivefitProcess, timeout: float = 30) -> int:
    """The model version both serving processes serve once they caught up; returns it."""
    deadline = time.monotonic() + timeout
    while True:
        version = learner.metric("livefit_model_version", model="demo", worker="training")
        served = per_worker(learner, "livefit_serving_version", model="demo")
        if version > 0 and served.get("0") == version and served.get("1") == version:
            return int(version)
        assert time.monotonic() < deadline, f"{served} != {version}:\n{learner.tail(40)}"
        time.sleep(0.1)


def series_by_worker(learner: LivefitProcess) -> dict[str, set[str]]:
    """The names of the samples each process of the group exports, by its worker label."""
    names: dict[str, set[str]] = {}
    for name, pairs in learner.metrics():
        worker = dict(pairs).get("worker")
        if worker is not None:
            names.setdefault(worker, set()).add(name)
    return names


def processes(learner: LivefitProcess) -> list[int]:
    assert learner.process is not None
    return group_processes(learner.process.pid)


def test_the_training_process_feeds_both_serving_processes(
    broker: Mosquitto, tmp_path: Path
) -> None:
    niced = "[processes]\ntraining_niceness = 10\n" + split_config(broker, tmp_path / "data")
    with LivefitProcess(niced, tmp_path).start() as learner:
        assert len(processes(learner)) == 3  # training and two serving processes
        publish_samples(broker, 2000)
        wait_trained(learner, 2000)
        version = wait_both_serve(learner)
        codes = predict_on_new_connections(learner, 20)
        assert codes == [200] * 20
        answered = per_worker(learner, "livefit_predict_requests_total", model="demo", code="200")
        assert sum(answered.values()) >= 20 and set(answered) >= {"0", "1"}, answered
        # freshness, by stage: the training process's to published, the serving processes' to
        # served (on one /metrics, apart: a sum over both would be neither)
        freshness = per_worker(
            learner, "livefit_freshness_seconds_count", model="demo", stage="published"
        )
        assert freshness.keys() == {"training"} and freshness["training"] >= 1, freshness
        served = per_worker(
            learner, "livefit_freshness_seconds_count", model="demo", stage="served"
        )
        assert served.keys() == {"0", "1"} and min(served.values()) >= 1, served
        stats = httpx.get(f"{learner.url}/api/stats", timeout=10).json()["models"]["demo"]
        assert stats["train_samples_total"] == 2000  # the training process's figure
        assert stats["model_version"] >= version
        assert stats["predict_requests_total"] >= 20  # summed over the serving processes
        assert per_worker(learner, "livefit_workers_unreachable") in ({"0": 0.0}, {"1": 0.0})
        # each process exports the series of the parts it runs, and no other process's at 0
        names = series_by_worker(learner)
        training, serving = {"livefit_broker_connected", "livefit_train_samples_total",
                             "livefit_model_version", "livefit_ingest_messages_total",
                             "livefit_published_version"}, {
                             "livefit_serving_version", "livefit_predict_requests_total",
                             "livefit_http_connections", "livefit_weights_received_total"}  # fmt: skip
        assert training <= names["training"] and not serving & names["training"], names
        for worker in ("0", "1"):
            assert serving <= names[worker] and not training & names[worker], names[worker]
        # the weight download (replicas' pulls) answers from a serving process
        weights = httpx.get(f"{learner.url}/v1/models/demo/weights", timeout=10)
        assert weights.status_code == 200 and len(weights.content) > 100
        log = learner.log.read_text()
        assert "[training]" in log and "[worker 0]" in log and "[worker 1]" in log
        assert learner.process is not None
        # the parent only supervises: it never loads TensorFlow (about 550 MiB of RSS)
        maps = Path(f"/proc/{learner.process.pid}/maps").read_text()
        assert "libtensorflow" not in maps, "the supervisor loaded TensorFlow"
        base = _thread_niceness(learner.process.pid)[learner.process.pid]  # CI may run niced
        training_pid = _training_pid(learner)
        assert training_pid is not None
        # processes.training_niceness (10 here; default 0): the threads that train (ingestion,
        # trainer, TensorFlow's pools) yield the cores; its main thread (status, metrics answers)
        # does not, so a machine busy with other work does not make readiness flap
        threads = _thread_niceness(training_pid)
        assert threads[training_pid] == base, threads
        lowered = [tid for tid, nice in threads.items() if nice >= min(base + 10, 19)]
        assert len(lowered) >= 3, threads  # (the trainer adds its own +5 while giving way)
        for pid in processes(learner):
            if pid != training_pid:
                assert set(_thread_niceness(pid).values()) == {base}, pid
        # processes.training_cores "auto" (issue #29): the training process runs on the cores the
        # serving processes leave (at least one; here 1 of 2, or every core on a 1-core mask),
        # every thread of it but the spawner (a broker it forks keeps every core); the serving
        # processes keep every core
        every = os.sched_getaffinity(0)
        pinned = training_cpus("auto", 2)
        masks = _thread_cpus(training_pid)
        if pinned is None:
            assert set(masks.values()) == {frozenset(every)}, masks
        else:
            narrowed = [tid for tid, cpus in masks.items() if cpus == frozenset(pinned)]
            assert len(narrowed) == len(masks) - 1 and training_pid in narrowed, masks
            assert f"training process on CPUs {pinned}" in log
        # and one inter-op thread (one model on the CPU, no serving: TRAINING_INTER_OP_THREADS),
        # as TensorFlow reports it set; its intra-op pool sized to its cores where it is pinned
        intra = 0 if pinned is None else len(pinned)
        assert f"TensorFlow thread pools: intra-op {intra}, inter-op 1 as set" in log, log[-3000:]
        for pid in processes(learner):
            if pid != training_pid:
                assert set(_thread_cpus(pid).values()) == {frozenset(every)}, pid


def test_sigkill_of_each_process_kind_loses_no_sample(broker: Mosquitto, tmp_path: Path) -> None:
    """SIGKILL of a serving process, SIGSTOP of one (killed and started again once silent for
    ``http.worker_timeout_s``, 3 s here), SIGKILL of the training process and of its
    replacement while it starts, SIGSTOP of the training process: predictions go on, every
    sample is trained."""
    text = split_config(broker, tmp_path / "data").replace(
        "[http]\n", "[http]\nworker_timeout_s = 3\n"
    )
    with LivefitProcess(text, tmp_path).start() as learner:
        publish_samples(broker, 1000)
        wait_trained(learner, 1000)
        wait_both_serve(learner)
        training_pid = _training_pid(learner)
        serving = [pid for pid in processes(learner) if pid != training_pid]

        # a serving process: started again while the other answers
        os.kill(serving[0], signal.SIGKILL)
        codes = predict_on_new_connections(learner, 10)
        assert codes.count(200) >= 5, codes
        _wait(lambda: len(processes(learner)) == 3 and serving[0] not in processes(learner))
        wait_both_serve(learner, timeout=60)

        # a serving process SIGSTOPped: new connections the kernel gives it would wait for
        # ever; silent past http.worker_timeout_s, it is SIGKILLed and started again
        stopped = serving[1]
        os.kill(stopped, signal.SIGSTOP)
        _wait(lambda: stopped not in processes(learner), timeout=20)
        _wait(lambda: len(processes(learner)) == 3, timeout=10)
        wait_both_serve(learner, timeout=60)
        assert predict_on_new_connections(learner, 6) == [200] * 6

        # the training process: the serving processes keep answering with what they hold,
        # readiness says why it is not ready, and the restarted one trains on
        os.kill(training_pid, signal.SIGKILL)
        _wait(lambda: _ready_problems(learner) != [], timeout=10)
        assert any("training" in p for p in _ready_problems(learner)), _ready_problems(learner)
        assert predict_on_new_connections(learner, 4) == [200] * 4
        publish_samples(broker, 1000, seed=1)  # while the training process is down or starting
        _wait(lambda: _training_pid(learner) not in (None, training_pid), timeout=30)
        # its replacement killed while it starts (a second OOM kill): counted as a restart,
        # not taken for a bad configuration (it used to end the whole learner, status 247)
        replacement = _training_pid(learner)
        assert replacement is not None
        os.kill(replacement, signal.SIGKILL)
        _wait(lambda: _training_pid(learner) not in (None, training_pid, replacement), 30)
        assert learner.process is not None and learner.process.poll() is None
        assert predict_on_new_connections(learner, 4) == [200] * 4
        # every sample in the lineage once: the first 1000 from the checkpoint (and the log
        # after it), the 1000 published while it was down. Not train_samples_total: it counts
        # what this training process trained, 1000 when a checkpoint held all of the first
        # (a test that read it failed whenever the checkpoint was that recent)
        wait_lineage(learner, 2000)
        _wait(lambda: _ready_problems(learner) == [], timeout=60)
        wait_both_serve(learner, timeout=60)

        # the training process SIGSTOPped: silent past http.worker_timeout_s, it is SIGKILLed
        # and started again; samples published meanwhile are trained by its replacement
        frozen = _training_pid(learner)
        assert frozen is not None
        os.kill(frozen, signal.SIGSTOP)
        publish_samples(broker, 1000, seed=2)
        _wait(lambda: _training_pid(learner) not in (None, frozen), timeout=30)
        assert predict_on_new_connections(learner, 4) == [200] * 4
        wait_lineage(learner, 3000)
        log = learner.log.read_text()
        assert log.count("training process exited with status -9; starting it again") == 3
        assert "serving worker" in log and "exited with status -9; starting it again" in log
        assert f"serving worker 1 (pid {stopped}) has not run for" in log, log[-3000:]
        assert f"the training process (pid {frozen}) has not run for" in log, log[-3000:]


def test_sigterm_trains_what_was_accepted_then_stops_serving(
    broker: Mosquitto, tmp_path: Path
) -> None:
    """Here without a fork server (``processes.preload = false``): the processes are the
    parent's own children, named after their roles all the same."""
    storage = tmp_path / "data"
    fresh = "[processes]\npreload = false\n" + split_config(broker, storage)
    learner = LivefitProcess(fresh, tmp_path / "a").start()
    pids = processes(learner)
    assert learner.process is not None  # no fork server: each started as python -m livefit
    assert children(learner.process.pid) == pids, [process_name(pid) for pid in pids]
    assert sorted(process_name(pid) for pid in pids) == [
        "livefit-train",
        "livefit-w0",
        "livefit-w1",
    ]
    publish_samples(broker, 3000)
    assert learner.stop(signal.SIGTERM, timeout=90) == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    log = learner.log.read_text()
    # in order: the training process's last checkpoint, then the serving processes stopped
    checkpoint = log.rindex("[training] livefit.server.train.checkpoint_writer: checkpoint demo")
    assert checkpoint < log.index("[worker 0] uvicorn.error: Shutting down")
    # nothing left to replay: whatever the broker handed over was trained and checkpointed
    again = LivefitProcess(config(broker, storage), tmp_path / "b").start()
    try:
        seen = again.metric("livefit_model_samples", model="demo")
        replayed = again.metric("livefit_wal_replayed_samples_total", model="demo")
        assert replayed == 0 and seen > 0, (seen, replayed)
        wait_lineage(again, 3000, timeout=90)  # the rest, redelivered by the broker
    finally:
        again.stop()


TENSORFLOW_NOISE = ("absl::InitializeLog", "cudart_stub", "cuInit", "cpu_feature_guard")


def log_time(line: str) -> float:
    """The time of a livefit log line (``2026-11-28 08:19:05,285 INFO ...``), in seconds."""
    clock = line.split()[1]
    hours, minutes, seconds = clock.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds.replace(",", "."))


def the_line(log: str, said: str) -> str:
    found = [line for line in log.splitlines() if said in line]
    assert len(found) == 1, (said, found, log[-3000:])
    return found[0]


def test_a_stop_after_predictions_on_a_kept_alive_connection_says_what_it_waits_for(
    broker: Mosquitto, tmp_path: Path
) -> None:
    """A newcomer's first run (issue 45): the log had TensorFlow's start-up noise from every
    process (absl's preamble, "Could not find cuda drivers", "failed call to cuInit" at ERROR:
    16 of 47 lines), and the first graceful stop took 21 s, the serving process idle for
    18.8 s with no line saying why: the training process's interpreter tore TensorFlow down
    after its last line (2.5 s of CPU, 16 s with two busy loops beside it). Now the TensorFlow
    processes log one line about the GPUs each, the training process exits as soon as it has
    stopped, and the parent says whom it waits for and how long it took; a client's kept-alive
    connection (curl, the dashboard) holds nothing up."""
    env = {k: v for k, v in quiet_env().items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # a user's
    text = with_workers(config(broker, tmp_path / "data"), 1)
    learner = LivefitProcess(text, tmp_path, env=env).start()
    publish_samples(broker, 500)
    wait_trained(learner, 500)
    with httpx.Client(timeout=30) as client:  # one connection, kept alive across requests
        for _ in range(3):
            answer = client.post(f"{learner.url}/v1/models/demo:predict",
                                 json={"instances": [[0.1] * 8]})  # fmt: skip
            assert answer.status_code == 200, answer.text
        started = time.monotonic()
        assert learner.stop(signal.SIGTERM, timeout=90) == 0
        took = time.monotonic() - started
    log = learner.log.read_text()
    print(f"\nstopped in {took:.1f} s:\n" + log[log.index("SIGTERM: stopping the learner") :])
    assert not [line for line in log.splitlines() if any(n in line for n in TENSORFLOW_NOISE)]
    for process in ("[training]", "[worker 0]"):
        the_line(log, f"{process} livefit.server.base.tensorflow_start: TensorFlow ")
    waits = the_line(log, "stopping: waiting up to 120 s for the training process (pid ")
    assert waits.endswith("to train what it accepted, checkpoint and publish")
    stopped = the_line(log, "[training] livefit.server.runtime.training_process: training "
                            "process stopped; exiting")  # fmt: skip
    exited = the_line(log, "livefit.server.runtime.workers: the training process (pid ")
    assert "exited after" in exited and exited.endswith("(status 0)")
    assert log_time(exited) - log_time(stopped) < 2.0, "the training process exits at once"
    assert log.index(exited) < log.index("[worker 0] uvicorn.error: Shutting down")
    the_line(log, "stopping: waiting up to 30 s for the serving processes (1) to answer the "
                  "requests they hold")  # fmt: skip
    assert "the serving processes (1) exited after" in log
    assert took < 60


@contextmanager
def sighup_default() -> Iterator[None]:
    """Processes started inside get SIGHUP's default disposition: children inherit an ignored
    SIGHUP (a test run started with ``nohup``), which livefit keeps ignoring by design."""
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, before)


def test_sighup_stops_every_process_of_the_group_as_sigterm_does(
    broker: Mosquitto, tmp_path: Path
) -> None:
    """A hangup (a closed terminal, ``systemctl kill -s HUP`` reaching every process) killed
    the whole group at once: no log line, no checkpoint, exit -1. It is a graceful stop, in
    the parent, the training process and the serving process alike (README, Commands)."""
    learner = LivefitProcess(with_workers(config(broker, tmp_path / "data"), 1), tmp_path)
    with sighup_default():  # as a terminal starts it, also when this test runs under nohup
        learner.start(ready_timeout_s=None)
    learner.wait_ready(120)
    pids = processes(learner)
    assert len(pids) == 2  # the training process and one serving process
    assert learner.process is not None
    [fork_server] = [
        pid for pid in children(learner.process.pid) if process_name(pid) == FORK_SERVER_NAME
    ]
    publish_samples(broker, 500)
    wait_trained(learner, 500)
    for pid in [*pids, fork_server]:  # the fork server too: it holds a hangup blocked
        os.kill(pid, signal.SIGHUP)
    assert learner.stop(signal.SIGHUP, timeout=90) == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in [*pids, fork_server])
    log = learner.log.read_text()
    for said in (
        "livefit.server.runtime.workers: SIGHUP: stopping the learner",
        "[training] livefit.server.runtime.training_process: SIGHUP: stopping the training",
        "[worker 0] livefit.server.runtime.http_server: SIGHUP: stopping, as on SIGTERM",
    ):
        assert said in log, log[-3000:]
    hangup = log.index("SIGHUP")
    assert log.rindex("[training] livefit.server.train.checkpoint_writer: checkpoint demo") > hangup
    assert "starting it again" not in log  # a hangup of a process of the group is no crash


def test_sigterm_under_backpressure_trains_every_acknowledged_sample(
    broker: Mosquitto, tmp_path: Path
) -> None:
    """A slow trainer (one sample a step) behind a 200-sample queue: at SIGTERM ingestion holds
    messages it logged and acknowledged but could not queue yet. They are trained before the
    learner exits (an outside attack found 28,000 such samples left to the next start's replay),
    so the final weights have every acknowledged sample and a restart replays nothing."""
    storage = tmp_path / "data"
    demo = model(builder="mlp", lines=SMALL_MLP, train="max_batch_size = 1\nqueue_capacity = 200")
    # Groups of at most 8 messages: what ingestion holds at SIGTERM (logged, acknowledged, not
    # queued) is one group, at most 400 samples, which the trainer's one-sample steps take well
    # within the 8 s a stopping ingestion gives them (``STOP_DELIVERY_S``) also on a loaded
    # machine (about 280 steps/s seen during the whole suite; with the default 1,000-message
    # groups, 64 messages were once still held after 8 s). The rest is with the broker.
    text = with_workers(
        learner_config(
            broker, storage, f"pressure-{broker.port}", demo, storage_lines="wal_group_max = 8"
        ),
        1,
    )
    learner = LivefitProcess(text, tmp_path / "a").start()
    publish_samples(broker, 6000)  # 120 messages of 50: the queue holds 4 of them
    _wait(lambda: learner.metric("livefit_queue_depth", model="demo") >= 150, timeout=60)
    assert learner.stop(signal.SIGTERM, timeout=90) == 0
    log = learner.log.read_text()
    assert "messages not queued" not in log, log[-3000:]
    # the restart in one process, and in batches of up to 256 (the model's weights do not
    # depend on it): one-sample steps made it train the rest for 80 s on a loaded machine
    again_text = with_workers(text, 0).replace("max_batch_size = 1\n", "max_batch_size = 256\n")
    assert "max_batch_size = 256" in again_text
    again = LivefitProcess(again_text, tmp_path / "b").start()
    try:
        replayed = again.metric("livefit_wal_replayed_samples_total", model="demo")
        assert replayed == 0, (replayed, log[-3000:])
        wait_lineage(again, 6000)  # the rest, redelivered by the broker
    finally:
        again.stop()


def test_a_second_learner_on_the_same_storage_exits_and_a_killed_parent_takes_every_process(
    broker: Mosquitto, tmp_path: Path
) -> None:
    """Who owns a split learner: a second ``livefit serve`` on its storage exits before it
    serves anything, naming the parent; SIGKILL of the parent takes its every process."""
    text = split_config(broker, tmp_path / "data")
    first = LivefitProcess(text, tmp_path / "first").start()
    try:
        pids = processes(first)
        assert len(pids) == 3
        (tmp_path / "second.toml").write_text(text)
        done = subprocess.run(
            [sys.executable, "-m", "livefit", "serve", "--config", str(tmp_path / "second.toml"),
             "--port", str(free_port())],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr[-3000:]
        assert "livefit.lock" in done.stderr or "in use" in done.stderr, done.stderr[-3000:]
        # It names the `livefit serve` to stop (the parent), not the training process that
        # holds the lock: stopping that one would only get it started again.
        assert f"(pid {first.pid} on " in done.stderr, done.stderr[-3000:]
        assert "serving worker 0 started" not in done.stderr  # nothing served, nothing connected
        assert predict_on_new_connections(first, 3) == [200] * 3
        assert first.stop(signal.SIGKILL, timeout=30) == -signal.SIGKILL
        _wait(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), timeout=10)
    finally:
        first.stop()


def _training_pid(learner: LivefitProcess) -> int | None:
    assert learner.process is not None
    return training_process(learner.process.pid)


def _thread_niceness(pid: int) -> dict[int, int]:
    """{thread id: niceness} of ``pid``'s threads (field 19 of /proc/<pid>/task/<tid>/stat)."""
    values = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended
            continue
        values[int(task.name)] = int(stat.rsplit(")", 1)[1].split()[16])
    return values


def _thread_cpus(pid: int) -> dict[int, frozenset[int]]:
    """{thread id: the CPUs it may run on} of ``pid``'s threads."""
    masks = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            masks[int(task.name)] = frozenset(os.sched_getaffinity(int(task.name)))
        except OSError:  # the thread ended
            continue
    return masks


def _ready_problems(learner: LivefitProcess) -> list[str]:
    try:
        response = httpx.get(f"{learner.url}/v2/health/ready", timeout=5)
    except httpx.TransportError:
        return ["unreachable"]
    return list(response.json().get("problems", [])) if response.status_code != 200 else []


def _wait(condition, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


@pytest.mark.parametrize("workers", ["-1", "65"])
def test_workers_out_of_range_are_refused_before_anything_starts(
    tmp_path: Path, workers: str
) -> None:
    (tmp_path / "c.toml").write_text("[models.demo]\ninput_shape = [8]\noutput_shape = [1]\n")
    done = subprocess.run(
        [sys.executable, "-m", "livefit", "serve", "--config", str(tmp_path / "c.toml"),
         "--workers", workers, "--port", str(free_port())],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--workers must be 0 to 64" in done.stderr
    assert not (tmp_path / "livefit-data").exists()
