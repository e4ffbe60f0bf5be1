"""The suite's fork server (``tests/forkserver.py``): a livefit server forked from it starts
where and as ``python -m livefit`` starts one (working directory, environment, standard
streams, process group, log), ends with the same exit statuses, and dies with the fork server;
an environment that differs in what is read while importing starts fresh."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from livefit.local_servers import LivefitProcess
from livefit.server.runtime.local_process import quiet_env
from livefit.server.runtime.mosquitto import Mosquitto
from tests import forkserver
from tests.configs import learner_config


@pytest.fixture
def server(tmp_path: Path) -> Iterator[forkserver.ForkServer]:
    """A fork server of this test's own, for the launches within it."""
    instance = forkserver.ForkServer(tmp_path / "forkserver")
    with forkserver.forking_from(instance):
        yield instance
    instance.stop()


def parent_of(process: LivefitProcess) -> int:
    return psutil.Process(process.pid).ppid()


def test_a_forked_server_starts_where_and_as_a_fresh_one(
    broker: Mosquitto, tmp_path: Path, server: forkserver.ForkServer
) -> None:
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    env = quiet_env(LIVEFIT_LOGGING__LEVEL="WARNING")  # a setting from the environment
    config = learner_config(broker, tmp_path / "data", "forked")
    learner = LivefitProcess(config, tmp_path, env=env, cwd=workdir, name="forked")
    with learner.start():
        assert server.process is not None and learner.process is not None
        pid = learner.pid
        assert parent_of(learner) == server.process.pid  # forked, not started
        assert os.getpgid(pid) == pid  # a group of its own, as start_child makes
        assert os.readlink(f"/proc/{pid}/cwd") == str(workdir)
        assert os.readlink(f"/proc/{pid}/fd/0") == os.devnull
        assert os.readlink(f"/proc/{pid}/fd/1") == os.readlink(f"/proc/{pid}/fd/2")
        assert os.readlink(f"/proc/{pid}/fd/1") == str(learner.log)
        answer = httpx.post(f"{learner.url}/v1/models/demo:predict",
                            json={"instances": [[0.0] * 8]}, timeout=10)  # fmt: skip
        assert answer.status_code == 200, answer.text
        with pytest.raises(subprocess.TimeoutExpired):
            learner.process.wait(0.1)
        assert learner.process.poll() is None
        log = learner.log.read_text()
        assert " INFO " not in log, log  # LIVEFIT_LOGGING__LEVEL reached it
        assert "cuda" not in log.lower(), log  # TensorFlow's start-up noise stays filtered
        forked_code = learner.stop()
    with forkserver.fresh_starts():
        fresh = LivefitProcess(config, tmp_path, env=env, cwd=workdir, name="fresh").start()
    assert parent_of(fresh) == os.getpid()
    assert fresh.stop() == forked_code == 0  # SIGTERM: stopped in order


def test_exit_statuses_are_those_of_a_fresh_start(
    broker: Mosquitto, tmp_path: Path, server: forkserver.ForkServer
) -> None:
    missing = tmp_path / "missing.toml"
    codes, lines = [], []
    for name in ("forked", "fresh"):
        with forkserver.forking_from(server if name == "forked" else None):
            process = LivefitProcess(missing, tmp_path, name=name).start(ready_timeout_s=None)
        assert process.process is not None
        codes.append(process.process.wait(60))
        lines.append(process.log.read_text().strip().splitlines()[-1])
    assert codes == [2, 2] and lines[0] == lines[1], (codes, lines)
    config = learner_config(broker, tmp_path / "data", "killed")
    learner = LivefitProcess(config, tmp_path, name="killed").start()
    assert learner.process is not None
    learner.process.send_signal(signal.SIGKILL)
    assert learner.process.wait(30) == -signal.SIGKILL
    assert learner.process.poll() == -signal.SIGKILL
    learner.process.send_signal(signal.SIGTERM)  # after its end: nothing is signalled


def test_a_forked_server_dies_with_the_fork_server(
    broker: Mosquitto, tmp_path: Path, server: forkserver.ForkServer
) -> None:
    config = learner_config(broker, tmp_path / "data", "orphan")
    learner = LivefitProcess(config, tmp_path).start()
    assert learner.process is not None and server.process is not None
    pid = learner.pid
    server.stop()  # SIGKILL
    assert learner.process.wait(30) == -signal.SIGKILL  # as the fork server could not report
    deadline = time.monotonic() + 30
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the forked learner outlived its fork server"
        time.sleep(0.05)
    learner.stop()


def test_an_environment_read_while_importing_starts_fresh(
    broker: Mosquitto, tmp_path: Path, server: forkserver.ForkServer
) -> None:
    config = learner_config(broker, tmp_path / "data", "own-env")
    env = quiet_env(TF_ENABLE_ONEDNN_OPTS="0")  # read by TensorFlow's import
    with LivefitProcess(config, tmp_path, env=env).start() as learner:
        assert parent_of(learner) == os.getpid()
