"""When and how long the prediction clients wait before trying again (``clients.predict_retry``)."""

from __future__ import annotations

import email.utils
import random
from datetime import UTC, datetime, timedelta

from livefit.clients.predict_retry import parse_retry_after, retry_delay_s


def test_parse_retry_after() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    later = email.utils.format_datetime(now + timedelta(seconds=3), usegmt=True)
    earlier = email.utils.format_datetime(now - timedelta(seconds=3), usegmt=True)
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("0.25") == 0.25
    assert parse_retry_after(later, now) == 3.0
    assert parse_retry_after(earlier, now) == 0.0
    assert parse_retry_after("Wed, 01 Jan 2025 12:00:03 -0000", now) == 3.0
    for unusable in (None, "", "soon", "-1", "nan", "inf"):
        assert parse_retry_after(unusable) is None


def test_retry_delay() -> None:
    jitter = random.Random(0)
    assert retry_delay_s(0, 5.0, 30.0, jitter) == 5.0
    assert retry_delay_s(3, 5.0, 0.2, jitter) == 0.2
    assert 0.025 <= retry_delay_s(0, 5.0, None, jitter) <= 0.05
    assert 0.2 <= retry_delay_s(3, 5.0, None, jitter) <= 0.4
    assert 2.5 <= retry_delay_s(50, 5.0, None, jitter) <= 5.0
    assert retry_delay_s(10_000, 5.0, None, jitter) <= 5.0
