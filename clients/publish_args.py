"""The options of `livefit publish` (``add_arguments``) and the parsers of their values
(``parse_shape`` and the argparse types). Parsing only: ``publish.run`` acts on them.
"""

from __future__ import annotations

import argparse

from livefit.server.wire.formats import FORMATS

from .publish_window import MAX_WINDOW


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of `livefit publish` to ``parser``."""
    add = parser.add_argument
    add(
        "--broker",
        default="mqtt://127.0.0.1:1883",
        metavar="URL",
        help="mqtt://[user:pass@]host[:port] or mqtts://..., or a cluster's nodes separated by "
        "commas (each tried in turn; default %(default)s)",
    )
    add("--model", default="demo", help="model name (default %(default)s)")
    add("--topic", help="topic to publish to (default livefit/<model>/samples)")
    _add_source_options(parser)
    _add_stream_options(parser)
    _add_connection_options(parser)
    _add_check_options(parser)


def _add_source_options(parser: argparse.ArgumentParser) -> None:
    """Where the samples come from: synthetic or a file, shape, count."""
    add = parser.add_argument
    add(
        "--source",
        default="synthetic",
        metavar="synthetic|PATH",
        help="'synthetic' (y = linear function of x + noise) or a .npz/.npy/.csv file",
    )
    add(
        "--input-shape",
        metavar="SHAPE",
        help="input shape, e.g. 8 or 20,3 (synthetic default 8; for a file, reshapes its rows)",
    )
    add(
        "--output-dim",
        metavar="N",
        type=_positive_int,
        default=1,
        help="synthetic targets per sample",
    )
    add(
        "--target-columns",
        metavar="N",
        type=_positive_int,
        default=1,
        help="last columns of a .npy/.csv file that are targets (default %(default)s)",
    )
    add(
        "--count",
        metavar="N",
        type=_positive_int,
        help="samples to publish (default 10000 synthetic; a file's rows once, cycling if more)",
    )


def _add_stream_options(parser: argparse.ArgumentParser) -> None:
    """How they are sent: rate, batch, format, QoS, window; the synthetic seed and noise."""
    add = parser.add_argument
    add(
        "--rate",
        type=_non_negative_float,
        default=0.0,
        metavar="SAMPLES_PER_S",
        help="samples per second, 0 = as fast as the window allows (default 0)",
    )
    add(
        "--batch",
        metavar="N",
        type=_positive_int,
        default=1,
        help="samples per message (default 1)",
    )
    add(
        "--format",
        choices=sorted(FORMATS),
        default="msgpack",
        dest="fmt",
        help="payload format (default %(default)s)",
    )
    add("--raw", action="store_true", help="raw little-endian buffers instead of lists (msgpack)")
    add("--qos", type=int, choices=(0, 1), default=1, help="MQTT QoS (default %(default)s)")
    add(
        "--window",
        metavar="N",
        type=_window,
        default=1000,
        help="most unacknowledged messages at once (default %(default)s)",
    )
    add(
        "--seed", metavar="N", type=int, default=0, help="synthetic data seed (default %(default)s)"
    )
    add(
        "--noise",
        type=_non_negative_float,
        default=0.01,
        help="synthetic noise std (default %(default)s)",
    )
    add("--source-id", metavar="ID", help="the payload's 'source' field (default <hostname>-<pid>)")


def _add_connection_options(parser: argparse.ArgumentParser) -> None:
    """The MQTT version, connect timeout, CA file and progress bar."""
    add = parser.add_argument
    add(
        "--mqtt-version",
        choices=("auto", "5", "3.1.1"),
        default="auto",
        help="MQTT protocol version; auto: 5, or 3.1.1 with a broker that speaks only that "
        "(default %(default)s)",
    )
    add(
        "--connect-timeout",
        type=_positive_float,
        default=10.0,
        metavar="SECONDS",
        help="give up connecting after this long (default %(default)s)",
    )
    add("--ca-file", metavar="PATH", help="CA certificates for mqtts:// (default: the system's)")
    add("--no-progress", action="store_true", help="no progress bar")


def _add_check_options(parser: argparse.ArgumentParser) -> None:
    """Listening for rejections, and delayed labels through a server."""
    add = parser.add_argument
    add(
        "--rejected-topic",
        metavar="TOPIC",
        help="the learner's dead-letter topic, where it reports rejected messages "
        "(default livefit/<model>/rejected; the model's dead_letter_topic)",
    )
    add(
        "--weights-topic",
        metavar="TOPIC",
        help="the model's weight topic, read once to see whether a learner serves it "
        "(default livefit/<model>/weights)",
    )
    add(
        "--rejection-wait",
        type=_non_negative_float,
        default=1.0,
        metavar="SECONDS",
        help="after the last acknowledgement, wait until no rejection was reported for this "
        "long (at most 10 s) (default %(default)s)",
    )
    add(
        "--no-check",
        action="store_true",
        help="do not listen for rejections nor look for a learner that takes the samples",
    )
    add(
        "--anyway",
        action="store_true",
        help="publish even when no learner seems to serve the model (no weights ever published "
        "on its weight topic): by default nothing is published then and the exit status is 1",
    )
    add(
        "--label-delay",
        type=int,
        metavar="N",
        help="delayed labels: predict each sample with an id through --server now, publish its "
        "label on livefit/<model>/labels N samples later (docs/labels.md)",
    )
    add(
        "--label-delay-random",
        action="store_true",
        help="with --label-delay: each label waits a uniform random 0 to N samples",
    )
    add(
        "--server",
        default="http://127.0.0.1:8000",
        metavar="URL",
        help="with --label-delay: the livefit server (learner or replica) that predicts",
    )


def parse_shape(text: str) -> tuple[int, ...]:
    """'8', '20,3' or '[20, 3]' -> a tuple of positive ints; ValueError otherwise."""
    cleaned = text.strip().strip("[]()")
    try:
        shape = tuple(int(part) for part in cleaned.split(",") if part.strip())
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise ValueError(f"--input-shape must be positive integers like 8 or 20,3, got {text!r}")
    return shape


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _window(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_WINDOW:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_WINDOW} (MQTT message ids)")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value
