"""livefit through the real server: a bench fleet (mosquitto and ``livefit serve``) holding one
model per case, fed each stream over MQTT, scored by the server's own prequential metrics."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.fleet import Fleet
from bench.learning.knobs import (
    BEFORE_RECOVERY,
    DEFAULTS,
    NO_TARGET_SCALING,
    RECOMMENDED,
    V01,
    Knobs,
)
from bench.learning.scores import Score
from bench.learning.streams import (
    BINARY,
    CHUNK,
    METRIC,
    MULTICLASS,
    QUICK_STREAMS,
    REGRESSION,
    STREAMS,
    SWEEP_STREAMS,
    Stream,
)

BEFORE = "before #30"  # the defaults before fast starts and drift recovery
PUBLISH_RATE = 2000.0  # samples/s: 80 messages/s, which the trainer takes one at a time


@dataclass(frozen=True, slots=True)
class Case:
    """One model of the server: a stream at some settings."""

    model: str
    stream: str
    side: str  # "defaults", "before #30", "v0.1 defaults", "recommended", "no target scaling"
    knobs: Knobs


def model_tables(
    cases: Sequence[Case], tables: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """One model table per case: the user's table of its stream, with the case's knobs."""
    return {c.model: c.knobs.model_config(dict(tables[c.stream])) for c in cases}


@contextlib.contextmanager
def learning_fleet(
    workdir: Path, cases: Sequence[Case], tables: Mapping[str, Mapping[str, Any]]
) -> Iterator[Fleet]:
    """A started bench fleet (no replica) holding every case's model; stopped on exit."""
    fleet = Fleet(workdir, model_tables(cases, tables), tag="learning")
    try:
        yield fleet.start(ready_timeout_s=240)
    finally:
        fleet.stop()


def feed(fleet: Fleet, model: str, stream: Stream, rate: float = PUBLISH_RATE) -> Score:
    """Publish ``stream`` to ``model`` in messages of ``CHUNK``; wait until all is trained.

    The first message goes alone and is trained before the rest follow at ``rate``: a fresh
    model's first step is slow (TensorFlow's first call), and the messages queued behind it
    would otherwise make one big first minibatch, which no long-running server has.
    """
    from livefit.clients.publisher import SamplePublisher

    started = time.perf_counter()
    topic = f"livefit/{model}/samples"
    publisher = SamplePublisher(fleet.broker.url, topic, source="bench-learning")
    with publisher:
        publisher.publish(stream.x[:CHUNK], stream.y[:CHUNK], batched=True)
        wait_counted(fleet, "livefit_train_samples_total", model, min(CHUNK, len(stream)), 60)
        rest = [(stream.x[CHUNK:], stream.y[CHUNK:])]
        publisher.publish_stream(rest, batch=CHUNK, rate=rate)
    timeout = 120 + len(stream) / 100
    wait_counted(fleet, "livefit_train_samples_total", model, len(stream), timeout)
    return _score(fleet, model, stream.task, time.perf_counter() - started)


def wait_counted(
    fleet: Fleet, counter: str, model: str, n: int, timeout: float, **labels: str
) -> None:
    """Wait until the learner's ``counter`` of ``model`` (and ``labels``) reaches ``n``."""
    deadline = time.monotonic() + timeout
    while fleet.learner.metric(counter, model=model, **labels) < n:
        fleet.learner.fail_if_exited()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{model}: {counter} below {n} after {timeout:.0f} s")
        time.sleep(0.2)


def _score(fleet: Fleet, model: str, task: str, seconds: float) -> Score:
    m = fleet.learner.metrics()

    def get(name: str, **labels: str) -> float:  # a counter never incremented is absent
        return m.get((name, tuple(sorted({"model": model, **labels}.items()))), 0.0)

    def cumulative(metric: str) -> float:
        return get("livefit_prequential_score", metric=metric, window="cumulative")

    count = get("livefit_train_batch_size_count")
    extra = {
        "steps": int(get("livefit_train_steps_total")),
        "minibatches": int(count),
        "mean_batch_size": get("livefit_train_batch_size_sum") / count if count else math.nan,
        "drift_detections": int(get("livefit_drift_detected_total")),
    }
    samples = int(get("livefit_train_samples_total"))
    if task == REGRESSION:
        return Score(
            math.nan, math.nan, samples, seconds, extra,
            mae=cumulative("mae"), rmse=math.sqrt(cumulative("mse")),
        )  # fmt: skip
    return Score(cumulative("accuracy"), cumulative("log_loss"), samples, seconds, extra)


# The settings each kind of stream runs at through the server, the user's configuration first.
SIDES: dict[str, list[tuple[str, Knobs]]] = {
    BINARY: [
        ("defaults", DEFAULTS),
        (BEFORE, BEFORE_RECOVERY),
        ("v0.1 defaults", V01),
        ("recommended", RECOMMENDED),
    ],
    MULTICLASS: [("defaults", DEFAULTS), (BEFORE, BEFORE_RECOVERY)],
    REGRESSION: [
        ("defaults", DEFAULTS),
        (BEFORE, BEFORE_RECOVERY),
        ("no target scaling", NO_TARGET_SCALING),
    ],
}
SUFFIX = {"defaults": "", BEFORE: "_before", "v0.1 defaults": "_v01", "recommended": "_rec",
          "no target scaling": "_raw"}  # fmt: skip


def server_cases(quick: bool) -> list[Case]:
    """Every stream (quick: ``QUICK_STREAMS``) at livefit's defaults (the user's configuration);
    in full runs also the
    other sides of ``SIDES``. A side whose effective settings equal an earlier side's is left
    out."""
    cases = []
    for name in QUICK_STREAMS if quick else STREAMS:
        spec = STREAMS[name]
        sides = SIDES[spec.task][:1] if quick else SIDES[spec.task]
        if name not in SWEEP_STREAMS:  # the older recommendations: where they were measured
            sides = [(side, k) for side, k in sides if side not in ("v0.1 defaults", "recommended")]
        unique: dict[str, tuple[str, Knobs]] = {}
        for side, knobs in sides:
            unique.setdefault(knobs.key(), (side, knobs))
        cases += [Case(f"{name}{SUFFIX[side]}", name, side, k) for side, k in unique.values()]
    return cases


def through_server(
    streams: dict[str, Stream], cases: Sequence[Case], workdir: Path, log: Callable[[str], None]
) -> dict[str, Score]:
    """Every case's score, through one broker and one ``livefit serve``, one stream at a time."""
    tables = {name: s.table() for name, s in streams.items()}
    scores: dict[str, Score] = {}
    with learning_fleet(workdir, cases, tables) as fleet:
        for case in cases:
            stream = streams[case.stream]
            scores[case.model] = score = feed(fleet, case.model, stream)
            metric = METRIC[stream.task]
            log(
                f"server {case.stream:<10} {case.side:<17} {metric} "
                f"{score.value(metric):.4f} mean batch {score.extra['mean_batch_size']:.1f} "
                f"({score.seconds:.0f} s)"
            )
    return scores
