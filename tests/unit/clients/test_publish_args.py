"""The options of ``livefit publish`` (``clients.publish_args``)."""

from __future__ import annotations

import argparse

import pytest

from livefit.clients.publish_args import add_arguments, parse_shape


def test_parse_shape() -> None:
    assert parse_shape("8") == (8,)
    assert parse_shape("[20, 3]") == (20, 3)
    for bad in ("", "a", "0", "3,-1"):
        with pytest.raises(ValueError):
            parse_shape(bad)


def cli_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="livefit publish")
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_match_the_bundled_demo() -> None:
    args = cli_args()
    assert (args.broker, args.model, args.fmt, args.batch, args.qos) == (
        "mqtt://127.0.0.1:1883",
        "demo",
        "msgpack",
        1,
        1,
    )
    assert (args.count, args.rate, args.window, args.input_shape) == (None, 0.0, 1000, None)
