"""The demo's stop request, with real signals sent to this process: each stop signal sets it
and names itself (the demo exits 128 + that signal), a second one kills the children at once,
and ``restore`` gives the signals back. ``tests/e2e/test_demo.py`` sends Ctrl-C to a real demo;
SIGTERM and SIGHUP reach the same handler."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from livefit.demo_stop import StopRequest


class Child:
    def __init__(self) -> None:
        self.killed = 0

    def kill(self) -> None:
        self.killed += 1


@pytest.fixture
def stop() -> Iterator[StopRequest]:
    request = StopRequest()
    request.install()
    try:
        yield request
    finally:
        request.restore()


def deliver(sig: int) -> None:
    """Send ``sig`` to this process; the handler runs in the main thread, between bytecodes."""
    os.kill(os.getpid(), sig)
    time.sleep(0.01)


# Started under nohup, a process keeps SIGHUP ignored and the demo leaves it so (stop_signals).
HANGUP_IGNORED = signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_sets_the_request_and_names_itself(stop: StopRequest, sig: int) -> None:
    if sig == signal.SIGHUP and HANGUP_IGNORED:
        pytest.skip("SIGHUP is ignored in this process (nohup): the demo keeps it so")
    child = Child()
    stop.children.append(child)  # type: ignore[arg-type]
    assert not stop.requested and not stop.wait(0)
    deliver(sig)
    assert stop.requested and stop.wait(0)
    assert stop.signal == sig
    assert child.killed == 0  # the first signal asks; the children stop in their own time


def test_a_second_signal_kills_the_children_at_once(stop: StopRequest) -> None:
    children = [Child(), Child()]
    stop.children.extend(children)  # type: ignore[arg-type]
    deliver(signal.SIGTERM)
    deliver(signal.SIGINT)
    assert [c.killed for c in children] == [1, 1]
    assert stop.signal == signal.SIGTERM  # the stop is still the first signal's


def test_restore_gives_the_signals_back() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    request = StopRequest()
    request.install()
    assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]
    request.restore()
    assert {sig: signal.getsignal(sig) for sig in before} == before
