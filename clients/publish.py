"""`livefit publish`: stream training samples to the server over MQTT.

``add_arguments`` and ``run`` are the CLI subcommand that livefit/cli.py mounts: ``run`` opens
the source, publishes it with a progress bar and reports what the learner rejected. The parts
live in modules of their own, and the names other code imports from here are re-exported:
``publisher`` (SamplePublisher, its errors and PublishStats), ``pacing`` (RatePacer, Chunks),
``rejections`` (RejectionWatcher) and ``publish_args`` (the options, parse_shape).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from .pacing import Chunks
from .publish_args import parse_shape
from .publish_results import (
    BrokerConnectionError,
    PublishError,
    PublishStats,
)
from .publisher import SamplePublisher
from .rejections import RejectionWatcher
from .synthetic import cycle_chunks, load_file, stream_chunks, stream_for_shape

LEARNER_WAIT_S = 2.0  # for the weight topic's retained message, before publishing


def run(args: argparse.Namespace) -> int:
    """Run `livefit publish`: 0 when every sample was acknowledged, 1 on a broker or publish
    failure, when the learner rejected every message, or when no learner seems to serve the
    model (nothing is published then, unless ``--anyway``), 2 on invalid options or an
    unreadable source, 130 when interrupted.

    Unless ``--no-check``, it listens on the model's dead-letter topic while it publishes and
    reports the rejections of its messages at the end; before the first sample it looks for a
    learner (``RejectionWatcher.nothing_listens``: no weights ever published for the model on
    this broker): without one it publishes nothing, or with ``--anyway`` publishes and warns."""
    try:
        chunks, count = _open_source(args)
        publisher = _make_publisher(args)
    except (ValueError, OSError) as exc:
        return _fail(str(exc), 2)
    if getattr(args, "label_delay", None) is not None:
        from .delayed import run_delayed

        return run_delayed(args, chunks, publisher)
    try:
        publisher.connect()
    except BrokerConnectionError as exc:
        return _fail(str(exc), 1)
    watcher = None
    try:
        if not getattr(args, "no_check", False):
            watcher = RejectionWatcher(
                publisher.client,
                publisher.topic,
                args.rejected_topic or f"livefit/{args.model}/rejected",
                args.weights_topic or f"livefit/{args.model}/weights",
                publisher.source,
            )
            watcher.start()
            if not watcher.wait_for_learner(LEARNER_WAIT_S) and not args.anyway:
                return _fail(_nobody(watcher, args.model, str(publisher.address), True), 1)
        with _progress_bar(count, enabled=not args.no_progress) as advance:
            stats = publisher.publish_stream(
                chunks,
                batch=args.batch,
                rate=args.rate,
                on_progress=advance,
                stop=getattr(args, "stop_event", None),
            )
        if watcher is not None:
            watcher.settle(args.rejection_wait)
    except PublishError as exc:
        return _fail(str(exc), 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    finally:
        publisher.close()
    print(f"{stats.summary()} to {publisher.topic} at {publisher.address}", flush=True)
    if stats.rejected or stats.dropped:
        return _fail(f"{stats.rejected + stats.dropped} messages were not delivered", 1)
    if watcher is not None:
        return _check_report(watcher, stats, args.model, str(publisher.address))
    return 0


def _check_report(watcher: RejectionWatcher, stats: PublishStats, model: str, broker: str) -> int:
    """What the learner said about the messages: 1 when it rejected every one of them."""
    if watcher.rejected:
        reason, detail = watcher.first or ("?", "?")
        first = " ".join(f"{reason}: {detail}".split())[:300]
        if watcher.rejected >= stats.messages:
            return _fail(
                f"the learner rejected every message ({watcher.rejected} of {stats.messages}), "
                f"the first for {first} (reports on {watcher.dead_letter_topic})",
                1,
            )
        _warn(
            f"the learner rejected {watcher.rejected} of {stats.messages} messages, the first "
            f"for {first} (reports on {watcher.dead_letter_topic})"
        )
    elif watcher.nothing_listens:
        _warn(_nobody(watcher, model, broker, False))
    return 0


def _nobody(watcher: RejectionWatcher, model: str, broker: str, before: bool) -> str:
    """What to say when no learner seems to serve ``model``: ``before`` publishing (nothing
    was sent), or after (``--anyway``)."""
    found = f"no weights on {watcher.weights_topic}"
    if not before:
        found += f" and no rejection reports on {watcher.dead_letter_topic}"
    check = (
        f"Check that `livefit serve` runs against this broker with a model named {model!r} "
        f"(--model) whose topic is {watcher.topic} (--topic); until one subscribes, the broker "
        "keeps samples only for a learner session it already knows"
    )
    if before:
        return (f"no learner seems to serve model {model!r} on {broker} ({found}): nothing "
                f"published. {check}. --anyway publishes all the same")  # fmt: skip
    return f"no learner seems to serve model {model!r} on {broker}: {found}. {check}"


def _warn(message: str) -> None:
    print(f"livefit publish: warning: {message}", file=sys.stderr, flush=True)


def _open_source(args: argparse.Namespace) -> tuple[Chunks, int]:
    chunk_size = args.batch * max(1, 4096 // args.batch)
    if args.source == "synthetic":
        shape = parse_shape(args.input_shape or "8")
        stream = stream_for_shape(shape, args.output_dim, args.noise, args.seed)
        count = args.count or 10_000
        return stream_chunks(stream, count, chunk_size), count
    x, y = load_file(args.source, args.target_columns)
    if args.input_shape:
        x = _reshape_inputs(x, parse_shape(args.input_shape), args.source)
    count = args.count or len(x)
    return cycle_chunks(x, y, count, chunk_size), count


def _reshape_inputs(x: np.ndarray, shape: tuple[int, ...], path: str) -> np.ndarray:
    if int(np.prod(x.shape[1:])) != int(np.prod(shape)):
        raise ValueError(
            f"{path}: samples of shape {list(x.shape[1:])} cannot be reshaped to {list(shape)}"
        )
    return x.reshape(len(x), *shape)


def _stream_kind(args: argparse.Namespace) -> str:
    return "labels" if getattr(args, "label_delay", None) is not None else "samples"


def _make_publisher(args: argparse.Namespace) -> SamplePublisher:
    return SamplePublisher(
        args.broker,
        args.topic or f"livefit/{args.model}/{_stream_kind(args)}",
        fmt="json" if _stream_kind(args) == "labels" else args.fmt,
        raw=args.raw and _stream_kind(args) == "samples",
        qos=args.qos,
        window=args.window,
        source=args.source_id or f"{socket.gethostname()}-{os.getpid()}",
        protocol="5" if args.mqtt_version == "auto" else args.mqtt_version,
        fall_back_to_311=args.mqtt_version == "auto",
        connect_timeout_s=args.connect_timeout,
        ca_certs=args.ca_file,
    )


class _SpeedColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} samples/s" if speed else "", style="progress.data.speed")


@contextmanager
def _progress_bar(total: int, *, enabled: bool) -> Iterator[Callable[[int], None]]:
    """A rich bar on stderr, or a no-op when disabled or stderr is not a terminal."""
    console = Console(stderr=True)
    if not (enabled and console.is_terminal):
        yield lambda _n: None
        return
    columns = (TextColumn("publishing"), BarColumn(), MofNCompleteColumn(), _SpeedColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("publish", total=total)
        yield lambda n: progress.advance(task, n)


def _fail(message: str, code: int) -> int:
    print(f"livefit publish: error: {message}", file=sys.stderr, flush=True)
    return code
