"""``free_port``: ports from ``LIVEFIT_FREE_PORTS`` when it is set, never one that is taken."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from livefit.server.runtime import local_process
from livefit.server.runtime.local_process import FREE_PORTS_ENV, LOOPBACK, free_port, port_range


@pytest.fixture
def fresh_cursor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_process, "_next_in_range", {})


def listening_on(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, port))
    sock.listen()
    return sock


def test_without_a_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FREE_PORTS_ENV, raising=False)
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert low <= free_port() <= high  # one of the kernel's ephemeral ports


@pytest.mark.usefixtures("fresh_cursor")
def test_ports_come_from_the_range_and_differ_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FREE_PORTS_ENV, "29100-29139")
    ports = [free_port() for _ in range(10)]
    assert all(29100 <= port <= 29139 for port in ports)
    assert len(set(ports)) == 10


def two_free_ports() -> int:
    """A port P such that P and P + 1 are free, below the kernel's ephemeral ports (which an
    outgoing connection could take at any moment) and outside the test workers' ranges."""
    for port in range(29200, 29900):
        if local_process.can_bind(LOOPBACK, port) and local_process.can_bind(LOOPBACK, port + 1):
            return port
    pytest.skip("no two free ports in 29200-29900")


@pytest.mark.usefixtures("fresh_cursor")
def test_a_port_something_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = two_free_ports()
    with listening_on(taken):
        monkeypatch.setenv(FREE_PORTS_ENV, f"{taken}-{taken + 1}")
        assert free_port() == taken + 1
        assert free_port() == taken + 1


@pytest.mark.usefixtures("fresh_cursor")
def test_a_range_with_nothing_free_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    holder = listening_on(0)
    taken = holder.getsockname()[1]
    with holder:
        monkeypatch.setenv(FREE_PORTS_ENV, f"{taken}-{taken}")
        with pytest.raises(RuntimeError, match=FREE_PORTS_ENV):
            free_port()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "20000",
        "20000-",
        "3-2",
        "0-10",
        "1-65536",
        "\u0661\u0660-\u0662\u0660",
        "10**400-2",
        "a-b",
        "-5-9",
    ],
)
def test_a_malformed_range_is_refused_with_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="LOW-HIGH"):
        port_range(text)


def test_a_range_reads_with_spaces() -> None:
    assert port_range(" 20000 - 20010 ") == (20000, 20010)
