"""``server/runtime/fork_server.py`` without a process: how a forked child's status reaches
its ``Popen`` (the fork server's line, or its end), a launch to a fork server that does not
answer, and the name a group's process takes. The fork server's processes themselves:
``tests/e2e/test_preloaded_group.py`` and ``tests/e2e/test_forkserver.py``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from livefit.server.runtime import fork_server
from livefit.server.runtime.fork_server import (
    ForkedChild,
    ForkServer,
    ForkServerGone,
    Launcher,
    LaunchRefused,
)
from livefit.server.runtime.group_directory import MAX_GROUP_DIRECTORY, SUN_PATH_MAX


def child() -> tuple[ForkedChild, socket.socket]:
    ours, theirs = socket.socketpair()
    return ForkedChild(4242, ours, ["python", "-m", "livefit"]), theirs


def test_the_status_the_fork_server_sends_is_the_exit_status() -> None:
    process, server = child()
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(0.05)
    server.sendall(b"exit -15\n")
    assert process.wait(5) == -15 and process.poll() == -15 and process.returncode == -15
    server.close()


def test_a_status_in_pieces_is_read_whole() -> None:
    process, server = child()
    server.sendall(b"exi")
    assert process.poll() is None
    server.sendall(b"t 2\n")
    assert process.wait(5) == 2
    server.close()


def test_a_fork_server_gone_reads_as_its_children_killed() -> None:
    process, server = child()
    server.close()
    assert process.wait(5) == -signal.SIGKILL


def test_a_launch_the_fork_server_does_not_answer_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork server that accepts but never answers (stopped, wedged): the launch gives up
    after ``LAUNCH_TIMEOUT_S`` with ``ForkServerGone``, which the group's launcher answers by
    starting that process fresh."""
    monkeypatch.setattr(fork_server, "LAUNCH_TIMEOUT_S", 0.2)
    server = ForkServer(tmp_path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(server.socket_path)
    listener.listen(1)
    monkeypatch.setattr(server, "running", lambda: True)
    with pytest.raises(ForkServerGone, match="did not answer"):
        server.launch(["python", "-m", "livefit", "serve"], {})
    listener.close()


def test_a_status_that_comes_with_the_pid_is_the_childs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child that ended before the launcher read its pid: the fork server's pid line and
    the status line can arrive in one read; the launch is not taken for a broken answer (the
    fork server abandoned), and the status is the child's."""
    server = ForkServer(tmp_path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(server.socket_path)
    listener.listen(1)
    kept: list[socket.socket] = []

    def answer() -> None:
        connection, _ = listener.accept()
        connection.recv(65536)
        connection.sendall(b"4242\nexit 3\n")
        kept.append(connection)  # left open: the status must not need its end

    answering = threading.Thread(target=answer)
    answering.start()
    monkeypatch.setattr(server, "running", lambda: True)
    try:
        process = server.launch(["python", "-m", "livefit", "serve"], {})
    finally:
        answering.join(10)
        listener.close()
    assert process.pid == 4242 and process.poll() == 3 and process.wait(1) == 3
    for connection in kept:
        connection.close()


def test_a_fork_server_that_fails_to_start_leaves_the_abandoned_ones_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new fork server that exits before it listens is killed alone: an abandoned one's
    children are still serving and must go on (they die with it)."""
    killed: list[str] = []

    class Exited:
        pid = 1

        def __init__(self, name: str) -> None:
            self.name = name

        def poll(self) -> int:
            return 1

        def kill(self) -> None:
            killed.append(self.name)

        def wait(self, timeout: float) -> int:
            return 1

    server = ForkServer(tmp_path)
    server.process = Exited("stopped")  # type: ignore[assignment]
    server.abandon()
    monkeypatch.setattr(fork_server, "start_child", lambda *a, **k: Exited("new"))
    with pytest.raises(ForkServerGone, match="did not start"):
        server.start()
    assert killed == ["new"] and server.process is None
    assert [p.name for p in server.abandoned] == ["stopped"]  # type: ignore[attr-defined]


def test_a_group_process_is_named_after_its_role(monkeypatch: pytest.MonkeyPatch) -> None:
    names: list[str] = []
    monkeypatch.setattr(fork_server, "set_process_name", names.append)
    for env, expected in (({"LIVEFIT_TRAINING_DIR": "/g"}, ["livefit-train"]),
                          ({"LIVEFIT_WORKER_INDEX": "3"}, ["livefit-w3"]), ({}, [])):  # fmt: skip
        names.clear()
        monkeypatch.delenv("LIVEFIT_TRAINING_DIR", raising=False)
        monkeypatch.delenv("LIVEFIT_WORKER_INDEX", raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        fork_server.name_process()
        assert names == expected


class Refusing(ForkServer):
    """A fork server whose every launch raises ``error`` (``ForkServerGone``: it never
    answers; ``LaunchRefused``: it answers that it could not fork)."""

    def __init__(self, directory: Path, error: Exception) -> None:
        super().__init__(directory)
        self.error = error
        self.launches: list[Sequence[str]] = []
        self.abandons = self.stops = 0

    def launch(self, argv: Sequence[str], env: Mapping[str, str],
               fds: Mapping[int, Sequence[int]] = {}) -> ForkedChild:  # fmt: skip
        self.launches.append(argv)
        raise self.error

    def abandon(self) -> None:
        self.abandons += 1

    def stop(self) -> None:
        self.stops += 1


NOT_ANSWERING = ForkServerGone("the fork server did not answer: timed out")
CANNOT_FORK = LaunchRefused("fork: [Errno 11] Resource temporarily unavailable")


@pytest.mark.parametrize(
    ("preload", "argv", "error", "abandons"),
    [
        (True, [sys.executable, "-m", "livefit", "serve"], NOT_ANSWERING, 1),
        (True, [sys.executable, "-m", "livefit", "serve"], CANNOT_FORK, 0),
        (False, [sys.executable, "-m", "livefit", "serve"], None, 0),
        (True, [sys.executable, "-m", "other"], None, 0),  # only livefit is preloaded
    ],
)
def test_the_launcher_starts_fresh_where_it_cannot_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preload: bool, argv: list[str],
    error: Exception | None, abandons: int,
) -> None:  # fmt: skip
    """A launch the fork server fails starts that process fresh, with the same command,
    environment and inherited descriptor: one it never answers leaves that fork server to its
    children (the next launch starts another) and kills nobody; one it could not fork keeps
    it. Without ``preload`` or for another command: fresh at once."""
    started: list[tuple[Sequence[str], dict[str, Any]]] = []

    def start_child(argv: Sequence[str], **popen: Any) -> str:
        started.append((argv, popen))
        return "fresh"

    monkeypatch.setattr(fork_server, "start_child", start_child)
    launcher = Launcher(tmp_path, preload)
    refusing = Refusing(tmp_path, error or NOT_ANSWERING)
    if launcher.server is not None:
        launcher.server = refusing
    assert launcher.start(argv, {"A": "1"}, pass_fds=(7,)) == "fresh"
    assert started == [(argv, {"env": {"A": "1"}, "pass_fds": (7,)})]
    assert refusing.launches == ([argv] if error else [])
    assert (refusing.abandons, refusing.stops) == (abandons, 0)


def test_the_fork_servers_socket_fits_a_group_directorys_budget() -> None:
    """The longest path a group directory holds must fit a Unix socket's (``SUN_PATH_MAX``):
    the fork server binds ``fork.sock.b`` in it, then renames it."""
    longest = MAX_GROUP_DIRECTORY + len(f"/{fork_server.SOCKET_NAME}{fork_server.BINDING_SUFFIX}")
    assert longest <= SUN_PATH_MAX


def test_an_abandoned_fork_server_is_killed_with_the_next_one_on_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    killed: list[str] = []

    class Stub:
        def __init__(self, name: str) -> None:
            self.name = name

        def kill(self) -> None:
            killed.append(self.name)

        def wait(self, timeout: float) -> int:
            return -9

    server = ForkServer(tmp_path)
    server.process = Stub("stopped")
    server.abandon()
    assert server.process is None and not killed
    server.process = Stub("next")
    server.stop()
    assert killed == ["stopped", "next"] and server.process is None and not server.abandoned


def request_over_a_socket(payload: bytes, fds: Sequence[int] = ()) -> socket.socket:
    """The fork server's end of a connection on which ``payload`` (with ``fds``) was sent."""
    ours, theirs = socket.socketpair()
    socket.send_fds(theirs, [payload], list(fds))
    theirs.close()
    return ours


def test_a_launch_from_any_process_but_the_parent_is_refused() -> None:
    """The fork server runs whatever it is asked: only the process that started it (the
    group's parent) may ask. Here the peer is this process, not its parent."""
    connection = request_over_a_socket(b'{"args": ["serve"], "env": {}}\n')
    with pytest.raises(ValueError, match=r"a launch from pid \d+, not from the parent"):
        fork_server._read_request(connection)
    connection.close()


@pytest.mark.parametrize(
    "payload",
    [
        b"\xff\xfe not json\n",
        b"[1, 2]\n",
        b'{"args": "serve", "env": {}}\n',
        b'{"args": ["serve"], "env": {"A": 1}}\n',
        b'{"args": ["serve"], "env": {}, "shell": "rm -rf /"}\n',
        b'{"args": ["serve"], "env": {}, "fds": [[3]]}\n',  # a place for a descriptor not sent
        b'{"args": ["serve"], "env": {}, "fds": [[100000000000000000000]]}\n',
        b'{"args": ["serve"], "env": {}, "fds": [[-1]]}\n',
    ],
)
def test_a_malformed_launch_is_refused_and_its_descriptors_closed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, payload: bytes
) -> None:
    monkeypatch.setattr(fork_server.os, "getppid", os.getpid)  # as if from the parent
    sent = (tmp_path / "sent").open("wb")
    connection = request_over_a_socket(payload, [sent.fileno()] if b"-1" in payload else [])
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(ValueError):
        fork_server._read_request(connection)
    assert set(os.listdir("/proc/self/fd")) <= before  # a received descriptor is closed
    connection.close()
    sent.close()


def test_a_launch_from_the_parent_comes_with_its_descriptors(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(fork_server.os, "getppid", os.getpid)
    with (tmp_path / "log").open("wb") as log:
        payload = b'{"args": ["serve"], "env": {"A": "1"}, "cwd": "/", "fds": [[1, 2]]}\n'
        connection = request_over_a_socket(payload, [log.fileno()])
        request, fds = fork_server._read_request(connection)
    assert (request.args, request.env, request.cwd, request.fds) == (["serve"], {"A": "1"}, "/",
                                                                     [[1, 2]])  # fmt: skip
    assert len(fds) == 1 and os.fstat(fds[0]).st_ino == (tmp_path / "log").stat().st_ino
    os.close(fds[0])
    connection.close()
