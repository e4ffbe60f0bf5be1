"""The learner's and replicas' version lines: one at INFO per interval, each version at DEBUG."""

from __future__ import annotations

import logging

import pytest

from livefit.server.weights.version_log import VersionLog


def test_versions_are_summarised_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    logger = logging.getLogger("livefit.test.versions")
    versions = VersionLog(logger, "demo", "served", interval_s=30.0, clock=lambda: now[0])
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        for version in range(150):  # two versions a second for 75 s
            versions.record(version, f"demo now serves version {version}")
            now[0] += 0.5
        versions.flush()
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == 150
    assert info == [
        "demo now serves version 0",
        "demo: 60 versions served in the last 30 s (v1 to v60)",
        "demo: 60 versions served in the last 30 s (v61 to v120)",
        "demo: 29 versions served in the last 15 s (v121 to v149)",
    ]


def test_flush_writes_nothing_new_twice(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("livefit.test.versions")
    versions = VersionLog(logger, "weights m", "published", clock=lambda: 0.0)
    with caplog.at_level(logging.INFO, logger=logger.name):
        versions.flush()
        versions.record(3, "weights m v3 published (inline, 10 bytes, 0.1 ms)", "; x")
        versions.record(4, "weights m v4 published (inline, 10 bytes, 0.1 ms)", "; the last")
        versions.flush()
        versions.flush()
    assert [r.getMessage() for r in caplog.records] == [
        "weights m v3 published (inline, 10 bytes, 0.1 ms)",
        "weights m: 1 version published in the last 0 s (v4 to v4; the last)",
    ]
