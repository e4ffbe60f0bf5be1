"""``Backoff``: doubling waits while something fails, none while it works."""

from __future__ import annotations

import time

import pytest

from livefit.server.base.backoff import Backoff


def test_waits_double_up_to_the_most_and_a_success_ends_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    retry = Backoff(first_s=1.0, max_s=5.0)
    assert retry.due() and not retry.failing
    waits = []
    for _ in range(5):
        retry.failed()
        started = now[0]
        while not retry.due():
            now[0] += 0.25
        waits.append(now[0] - started)
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0] and retry.failures == 5
    retry.failed()
    retry.succeeded()
    assert retry.due() and not retry.failing


def test_a_first_wait_longer_than_the_most_is_refused() -> None:
    with pytest.raises(ValueError, match="first_s"):
        Backoff(first_s=2.0, max_s=1.0)
