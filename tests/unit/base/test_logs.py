"""Structured logs: with logging.json every line is one JSON object with ts, level, logger."""

from __future__ import annotations

import json
import logging

import pytest

from livefit.server.base.logs import configure_logging, current_logging


def test_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging("INFO", json_format=True)
        logging.getLogger("livefit.test").info("rejected a message on %s: %s", "t/x", "bad_shape")
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("livefit.test").exception("step failed")
        logging.getLogger("livefit.test").debug("not shown at INFO")
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [line["message"] for line in lines] == [
        "rejected a message on t/x: bad_shape",
        "step failed",
    ]
    assert (
        lines[0]["level"] == "INFO" and lines[0]["logger"] == "livefit.test" and lines[0]["ts"] > 0
    )
    assert "ValueError: boom" in lines[1]["exception"]


@pytest.mark.parametrize(
    ("level", "json_format"), [("WARNING", True), ("DEBUG", False), (25, False)]
)
def test_current_logging_reads_what_configure_logging_set(
    level: str | int, json_format: bool
) -> None:
    """What a group's parent passes on to its fork server (``fork_server.ForkServer``)."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging(level, json_format=json_format)
        number = level if isinstance(level, int) else logging.getLevelName(level)
        assert current_logging() == (number, json_format)
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
