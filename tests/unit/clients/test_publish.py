"""``livefit publish`` (``clients.publish``): an unreachable broker and bad options. Its parts
have their own files (``test_payloads.py``, ``test_synthetic.py``, ``test_pacing.py``,
``test_publish_args.py``); against a real mosquitto (and a real ``livefit serve``):
``tests/e2e/test_publish_broker.py``."""

from __future__ import annotations

import argparse
import time

import pytest

from livefit.clients import publish
from livefit.clients.publish_args import add_arguments
from livefit.server.runtime.local_process import free_port


def cli_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="livefit publish")
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_run_fails_fast_on_an_unreachable_broker(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"mqtt://127.0.0.1:{free_port()}"
    start = time.monotonic()
    code = publish.run(cli_args("--broker", url, "--connect-timeout", "2", "--no-progress"))
    assert code == 1 and time.monotonic() - start < 5
    assert f"cannot reach the MQTT broker at {url}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ("--broker", "http://x"),
        ("--format", "json", "--raw"),
        ("--input-shape", "2,3,4"),
        ("--source", "/nonexistent/data.csv"),
    ],
)
def test_run_rejects_bad_options_with_code_2(
    argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert publish.run(cli_args(*argv)) == 2
    assert "livefit publish: error:" in capsys.readouterr().err
