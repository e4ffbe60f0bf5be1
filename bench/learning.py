"""Learning quality: prequential accuracy through the real server, against per-sample learners.

``python -m bench.learning [--quick] [--sweep]`` writes ``bench/results/learning.json`` and
``bench/results/learning.md`` (``--quick``: ``learning-quick.*``, small slices that check the
harness, not the quality).

Three public streams, fixed seeds, each in its own order for every side:

* **phishing**: ``river.datasets.Phishing``, a real web-phishing dataset shipped inside river
  (1,250 samples, 9 features);
* **SEA, abrupt drift**: the four SEA concepts (``river.datasets.synth.SEA`` variants 0-3,
  10 % label noise), 5,000 samples each, switched abruptly;
* **Hyperplane, gradual drift**: ``river.datasets.synth.Hyperplane`` (10 features, 5 drifting
  by 0.001 per sample, 5 % noise), 20,000 samples.

**livefit**: a real mosquitto and a real ``livefit serve`` (one model per stream and settings);
the stream goes over MQTT in order, in QoS 1 messages of 25 samples, paced so the trainer keeps
up (each message is one minibatch; the first is trained before the rest follow, so that a fresh
process's slow first step does not merge the next messages into one big minibatch); the figure
is the server's own
``livefit_prequential_score{window="cumulative"}``: every sample scored before the model trained
on it, read once ``livefit_train_samples_total`` equals the stream length. **Peers**: river's
per-sample learners, test-then-train one sample at a time on the same samples. Accuracy within
stretches of each stream comes from the same settings run in-process (below), which matches the
server to the sample.

The defaults sweep (``--sweep``) runs livefit's trainer in this process (the server's
``Trainer``, ``SampleQueue`` and update policy fed chunks of 25 in stream order, without MQTT)
over a staged grid of optimizer, learning rate, builder, steps per batch, replay, scaling and
drift reaction, and checks that the in-process and through-the-server figures agree.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.harness import REPO, now_iso

if TYPE_CHECKING:
    from bench.harness import BenchResult, Context
    from bench.procs import HttpServer

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

CHUNK = 25  # samples per MQTT message, and per minibatch when the trainer keeps up
PUBLISH_RATE = 2000.0  # samples/s: 80 messages/s, which the trainer takes one at a time
QUICK_SAMPLES = 500
STREAM_SEED = 42
MODEL_SEED = 7
TARGET = "livefit accuracy ≥ logistic regression accuracy, at livefit's default settings"
LR = "logistic regression"
HT = "Hoeffding tree"
DASH = "\u2013"  # en dash, for ranges
EPS = 1e-7  # probabilities are clipped to [EPS, 1 - EPS] for log loss, as livefit does


# -- streams ---------------------------------------------------------------------------------
Rows = Iterable[tuple[dict[str, Any], Any]]


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """A public stream: how to make it (river's dict rows), in a fixed order."""

    name: str
    title: str
    kind: str
    source: str  # Markdown: the generator call
    samples: int
    make: Callable[[int], Rows]  # seed -> rows
    seeded: bool = True  # False: a fixed dataset, the same whatever the seed


def _phishing(seed: int) -> Rows:
    from river import datasets

    return datasets.Phishing()  # a fixed dataset: the seed does not apply


def _sea_concepts(seed: int) -> Rows:
    """The four SEA concepts (thresholds 8, 9, 7, 9.5), 5,000 samples each, switched abruptly."""
    from river.datasets import synth

    return itertools.chain.from_iterable(
        synth.SEA(variant=v, noise=0.1, seed=seed + v).take(5000) for v in range(4)
    )


def _hyperplane(seed: int) -> Rows:
    from river.datasets import synth

    return synth.Hyperplane(
        seed=seed,
        n_features=10,
        n_drift_features=5,
        mag_change=0.001,
        noise_percentage=0.05,
        sigma=0.1,
    ).take(20_000)


STREAMS: dict[str, StreamSpec] = {
    s.name: s
    for s in (
        StreamSpec(
            "phishing",
            "Phishing (real)",
            "real dataset",
            "`river.datasets.Phishing()`",
            1250,
            _phishing,
            seeded=False,
        ),
        StreamSpec(
            "sea",
            "SEA concepts (abrupt drift)",
            "synthetic, abrupt drift",
            "`synth.SEA(variant=v, noise=0.1, seed=42 + v).take(5000)` for v = 0, 1, 2, 3, "
            "concatenated (3 abrupt switches)",
            20_000,
            _sea_concepts,
        ),
        StreamSpec(
            "hyperplane",
            "Hyperplane (gradual drift)",
            "synthetic, gradual drift",
            "`synth.Hyperplane(seed=42, n_features=10, n_drift_features=5, mag_change=0.001, "
            "noise_percentage=0.05, sigma=0.1).take(20000)`",
            20_000,
            _hyperplane,
        ),
    )
}


@dataclass(frozen=True, slots=True)
class Stream:
    """A stream's samples: river's rows for the peers, float arrays in a fixed order for livefit."""

    spec: StreamSpec
    seed: int
    rows: list[tuple[dict[str, Any], bool]]
    features: tuple[str, ...]
    x: np.ndarray  # (n, features) float32
    y: np.ndarray  # (n, 1) float32, 0 or 1

    def __len__(self) -> int:
        return len(self.rows)


def load_stream(spec: StreamSpec, limit: int | None = None, seed: int = STREAM_SEED) -> Stream:
    """The first ``limit`` samples of ``spec`` (all of them by default), generated with ``seed``."""
    made = spec.make(seed)
    rows = [(x, bool(y)) for x, y in itertools.islice(made, limit or spec.samples)]
    features = tuple(rows[0][0])
    x = np.array([[float(r[k]) for k in features] for r, _ in rows], dtype=np.float32)
    y = np.array([[float(label)] for _, label in rows], dtype=np.float32)
    return Stream(spec, seed if spec.seeded else STREAM_SEED, rows, features, x, y)


# -- scores ----------------------------------------------------------------------------------
@dataclass(slots=True)
class Score:
    """One learner's test-then-train figures on one stream."""

    accuracy: float
    log_loss: float
    samples: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)  # steps, batch sizes, drift detections
    correct: np.ndarray | None = None  # per sample, 1.0 where right (not written to JSON)

    def to_json(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy,
            "log_loss": self.log_loss,
            "samples": self.samples,
            "seconds": round(self.seconds, 3),
            **self.extra,
        }


def segment_edges(n: int) -> list[int]:
    """Where the accuracy-over-time figures cut a stream: the first 100 samples, then quarters."""
    return sorted({0, min(100, n), n // 4, n // 2, 3 * n // 4, n})


def segments(correct: np.ndarray, edges: Sequence[int]) -> list[float]:
    """Accuracy within each stretch between consecutive ``edges``."""
    return [float(correct[a:b].mean()) for a, b in itertools.pairwise(edges) if b > a]


# -- peers: river, one sample at a time --------------------------------------------------------
def _logistic_regression() -> Any:
    from river import linear_model, preprocessing

    return preprocessing.StandardScaler() | linear_model.LogisticRegression()


def _hoeffding_tree() -> Any:
    from river import tree

    return tree.HoeffdingTreeClassifier()


PEERS: dict[str, tuple[str, Callable[[], Any]]] = {
    LR: ("`preprocessing.StandardScaler() | linear_model.LogisticRegression()`",
         _logistic_regression),
    HT: ("`tree.HoeffdingTreeClassifier()`", _hoeffding_tree),
}  # fmt: skip


def peer_score(make_model: Callable[[], Any], stream: Stream) -> Score:
    """Test-then-train, one sample at a time: ``predict_proba_one``, then ``learn_one``.

    The prediction is river's ``predict_one`` (the most probable class; none before the model
    has seen a class, which counts as wrong, as in ``evaluate.progressive_val_score``).
    """
    from river import metrics

    model = make_model()
    accuracy = metrics.Accuracy()
    correct = np.zeros(len(stream), dtype=np.float32)
    loss = 0.0
    started = time.perf_counter()
    for i, (x, y) in enumerate(stream.rows):
        proba = model.predict_proba_one(x)
        predicted = max(proba, key=proba.get) if proba else None
        accuracy.update(y, predicted)
        correct[i] = predicted == y
        loss += _log_loss(proba.get(True, 0.0) if proba else 0.5, y)
        model.learn_one(x, y)
    seconds = time.perf_counter() - started
    return Score(accuracy.get(), loss / len(stream), len(stream), seconds, correct=correct)


def _log_loss(p_true: float, y: bool) -> float:
    p = min(max(p_true, EPS), 1 - EPS)
    return -math.log(p if y else 1 - p)


def peer_scores(stream: Stream) -> dict[str, Score]:
    return {name: peer_score(make, stream) for name, (_, make) in PEERS.items()}


# -- livefit's settings under test -----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Knobs:
    """The learning settings under test; ``None`` leaves livefit's default in place."""

    builder: str = "mlp"
    activation: str | None = None  # the MLP's hidden activation (builder option)
    hidden_units: tuple[int, ...] | None = None  # the MLP's hidden layers (builder option)
    optimizer: str | None = None
    learning_rate: float | None = None
    steps_per_batch: int | None = None
    replay_capacity: int | None = None
    replay_mode: str | None = None
    replay_share: float | None = None
    scaling: str | None = None
    drift_reaction: str | None = None
    drift_threshold: float | None = None
    seed: int = MODEL_SEED

    def model_config(self, n_features: int) -> dict[str, Any]:
        """The ``[models.<name>]`` table (as a dict) of a binary classifier with these knobs."""
        options: dict[str, Any] = {"output_activation": "sigmoid"}
        if self.activation is not None:
            options["activation"] = self.activation
        if self.hidden_units is not None:
            options["hidden_units"] = list(self.hidden_units)
        config: dict[str, Any] = {
            "builder": self.builder,
            "builder_options": options,
            "input_shape": [n_features],
            "output_shape": [1],
            "loss": "binary_crossentropy",
            "metrics": ["accuracy"],
            "seed": self.seed,
        }
        for key in ("optimizer", "learning_rate", "scaling"):
            if getattr(self, key) is not None:
                config[key] = getattr(self, key)
        train = {
            k: getattr(self, k)
            for k in ("steps_per_batch", "replay_capacity", "replay_mode", "replay_share")
            if getattr(self, k) is not None
        }
        if train:
            config["train"] = train
        drift = {
            k: v
            for k, v in (("reaction", self.drift_reaction), ("threshold", self.drift_threshold))
            if v is not None
        }
        if drift:
            config["drift"] = drift
        return config

    def resolved(self, n_features: int = 1) -> dict[str, Any]:
        """The effective learning settings: these knobs over livefit's defaults."""
        from livefit.server.config import ModelSettings

        s = ModelSettings.model_validate(self.model_config(n_features))
        replay = s.train.replay_capacity > 0 and s.train.replay_share > 0
        return {
            "builder": s.builder,
            **_builder_facts(s.builder, s.builder_options),
            "optimizer": s.optimizer,
            "learning_rate": s.learning_rate,
            "steps_per_batch": s.train.steps_per_batch,
            "replay_capacity": s.train.replay_capacity if replay else 0,
            "replay_mode": s.train.replay_mode if replay else None,
            "replay_share": s.train.replay_share if replay else 0.0,
            "scaling": s.scaling,
            "drift_reaction": s.drift.reaction,
            "drift_threshold": s.drift.threshold,
        }

    def key(self) -> str:
        """Identifies the effective settings and seed (knobs spelled differently, same key)."""
        return json.dumps([self.resolved(), self.seed], sort_keys=True)

    def label(self) -> str:
        """A short human label of the effective settings."""
        return describe(self.resolved())


def describe(r: dict[str, Any]) -> str:
    """``mlp relu, adam lr 0.003, 2 steps, replay reservoir 2000 x 0.5`` for resolved settings."""
    model = r["builder"]
    if model == "mlp":
        model = f"mlp {r['activation']}"
        if r["hidden_units"] != [64, 64]:
            model += f" {'x'.join(str(u) for u in r['hidden_units'])}"
    parts = [
        model,
        f"{r['optimizer']} lr {r['learning_rate']:g}",
        f"{r['steps_per_batch']} step{'s' if r['steps_per_batch'] > 1 else ''}",
    ]
    if r["replay_capacity"]:
        parts.append(f"replay {r['replay_mode']} {r['replay_capacity']} x {r['replay_share']:g}")
    else:
        parts.append("no replay")
    if r["scaling"] != "standardize":
        parts.append(f"scaling {r['scaling']}")
    if r["drift_reaction"] != "none":  # the threshold only matters when drift changes learning
        parts.append(f"on drift (threshold {r['drift_threshold']:g}) {r['drift_reaction']}")
    return ", ".join(parts)


def _builder_facts(builder: str, options: dict[str, Any]) -> dict[str, Any]:
    """The MLP's hidden units and activation, with the builder's defaults filled in."""
    if builder != "mlp":
        return {"hidden_units": None, "activation": None}
    from livefit.models.builders import _DEFAULT_OPTIONS

    defaults = _DEFAULT_OPTIONS["mlp"]
    return {
        "hidden_units": list(options.get("hidden_units", defaults["hidden_units"])),
        "activation": options.get("activation", defaults["activation"]),
    }


DEFAULTS = Knobs()  # whatever livefit's defaults are when the benchmark runs
V01 = Knobs(  # livefit 0.1's defaults, explicitly: the "before" of the issue
    activation="relu",
    optimizer="adam",
    learning_rate=0.001,
    steps_per_batch=1,
    replay_capacity=0,
    scaling="standardize",
    drift_reaction="none",
)
# The defaults before the recent-window replay (the previous recommendation), for comparison.
PREVIOUS = replace(V01, optimizer="nadam", learning_rate=0.01)
# Chosen from the sweep below (see BENCHMARKS.md, "Learning quality"); spelled out, not taken
# from livefit's defaults, so that this stays what was measured when the defaults change.
RECOMMENDED = replace(
    PREVIOUS,
    activation="tanh",
    steps_per_batch=2,
    replay_capacity=500,
    replay_mode="window",
    replay_share=0.75,
)


WHY_RECOMMENDED = (
    "The recommended settings rather than the sweep's best when they differ: the sweep ranks "
    "by the worst stream at the reference seeds only, and its winner changes with differences "
    "of a few samples; the robustness table decides. A learning rate of 0.001 is what costs "
    "livefit most (0.1's defaults); nadam leads adam at the same rate. Two steps per batch, "
    "each on the new samples plus three times as many replayed from a window of the last 500, "
    "are what closes the gap to per-sample logistic regression: early in a stream they give "
    "the minibatch learner several passes over what it has seen so far (a per-sample learner "
    "makes 25 updates per 25 samples), and a short window forgets a concept that drifted away. "
    "Over the reference and six further seeds the recommended settings lead logistic "
    "regression on average on every stream, where the previous defaults (relu, 1 step, no "
    "replay) trail it on two of three. A reservoir replays stale concepts and costs 0.5 to 1 "
    "point on the drifting streams; a window of 2000 or more too. The extra work is done only "
    "while the trainer keeps up (train.extras_when = caught_up), so a backlog is trained at "
    "the plain step's rate."
)


# -- livefit in this process: the server's trainer without MQTT --------------------------------
def learn_inprocess(stream: Stream, knobs: Knobs, chunk: int = CHUNK) -> Score:
    """Feed ``stream`` to a real ``Trainer`` in chunks of ``chunk``, each one minibatch.

    The same code path as the server from the sample queue on (update policy, train step,
    prequential scores), on this thread: no MQTT, no write-ahead log, no timing effects.
    """
    import keras

    from livefit.server.samples import SampleChunk

    trainer = _trainer(knobs, stream)
    trainer.scores = recorder = _recording_scores(trainer.scores)
    queue = trainer.queue
    started = time.perf_counter()
    with _quiet("livefit.server.update_policy"):  # a warning per detected drift
        for start in range(0, len(stream), chunk):
            x, y = stream.x[start : start + chunk], stream.y[start : start + chunk]
            queue.put(SampleChunk(x, y, np.ones(len(x), dtype=np.float32)))
            batch = queue.next_batch(chunk)
            assert batch is not None
            trainer.train_batch(batch)
    seconds = time.perf_counter() - started
    scores = trainer.scores.scores
    detections = trainer.policy.drift.detections if trainer.policy.drift is not None else 0
    score = Score(
        scores["accuracy"].cumulative,
        scores["log_loss"].cumulative,
        trainer.samples_seen,
        seconds,
        {"steps": trainer.version, "drift_detections": detections},
        correct=np.concatenate(recorder.correct),
    )
    del trainer, queue
    keras.utils.clear_session(free_memory=True)
    gc.collect()
    return score


def _trainer(knobs: Knobs, stream: Stream) -> Any:
    from prometheus_client import CollectorRegistry

    from livefit.server.config import ModelSettings
    from livefit.server.metrics import Metrics
    from livefit.server.modeling import resolve_device
    from livefit.server.samples import SampleQueue
    from livefit.server.snapshot import SnapshotSlot
    from livefit.server.trainer import Trainer

    config = knobs.model_config(stream.x.shape[1])
    config.setdefault("train", {})["queue_capacity"] = len(stream) + 1
    settings = ModelSettings.model_validate(config)
    metrics = Metrics(CollectorRegistry())
    metrics.init_model("learning")
    queue = SampleQueue(settings.train.queue_capacity)
    trainer = Trainer("learning", settings, queue, SnapshotSlot(), metrics, resolve_device("auto"))
    trainer.warm_up()
    return trainer


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """Only errors from ``logger_name`` while inside (its level restored after)."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _recording_scores(scores: Any) -> Any:
    """The trainer's prequential scores, also keeping which samples were predicted right."""
    from livefit.server.prequential import PrequentialScores, correct_predictions

    class Recording(PrequentialScores):
        def __init__(self) -> None:
            super().__init__(scores.scores["loss"].window, scores.classification, scores.sparse)
            self.correct: list[np.ndarray] = []

        def add(self, losses: np.ndarray, y_true: np.ndarray, y_pred: np.ndarray) -> None:
            super().add(losses, y_true, y_pred)
            self.correct.append(correct_predictions(y_true, y_pred, self.sparse))

    return Recording()


# -- livefit through the real server -----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Case:
    """One model of the server: a stream at some settings."""

    model: str
    stream: str
    side: str  # "defaults", "v0.1 defaults", "recommended"
    knobs: Knobs


class LearningServer:
    """A mosquitto and one ``livefit serve`` holding one model per case; stopped on exit."""

    def __init__(self, workdir: Path, cases: Sequence[Case], features: dict[str, int]) -> None:
        from bench.procs import Mosquitto, livefit_server

        self.broker = Mosquitto(workdir / "broker")
        config = server_config(self.broker.url, workdir / "storage", cases, features)
        self.server: HttpServer = livefit_server("learner", config, workdir)

    @contextlib.contextmanager
    def running(self) -> Iterator[LearningServer]:
        from bench.procs import running

        with running(self.broker, self.server):
            self.broker.start()
            self.server.start()
            self.server.wait_ready(timeout=240)
            yield self

    def feed(self, model: str, stream: Stream, rate: float = PUBLISH_RATE) -> Score:
        """Publish ``stream`` to ``model`` in messages of ``CHUNK``; wait until all is trained.

        The first message goes alone and is trained before the rest follow at ``rate``: a fresh
        model's first step is slow (TensorFlow's first call), and the messages queued behind it
        would otherwise make one big first minibatch, which no long-running server has.
        """
        from livefit.clients.publish import SamplePublisher

        started = time.perf_counter()
        publisher = SamplePublisher(
            self.broker.url, f"livefit/{model}/samples", source="bench-learning"
        )
        with publisher:
            publisher.publish(stream.x[:CHUNK], stream.y[:CHUNK], batched=True)
            self._wait_trained(model, min(CHUNK, len(stream)), timeout=60)
            rest = [(stream.x[CHUNK:], stream.y[CHUNK:])]
            publisher.publish_stream(rest, batch=CHUNK, rate=rate)
        self._wait_trained(model, len(stream), timeout=120 + len(stream) / 100)
        return self._score(model, time.perf_counter() - started)

    def _wait_trained(self, model: str, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.server.metric("livefit_train_samples_total", model=model) < n:
            self.server.fail_if_exited()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{model}: not all {n} samples trained within {timeout:.0f} s")
            time.sleep(0.2)

    def _score(self, model: str, seconds: float) -> Score:
        m = self.server.metrics()

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
        return Score(cumulative("accuracy"), cumulative("log_loss"), samples, seconds, extra)


def server_config(
    broker_url: str, storage: Path, cases: Sequence[Case], features: dict[str, int]
) -> str:
    """A livefit config: the bench's broker and storage, one model table per case."""
    tables = [
        _toml_table(f"models.{c.model}", c.knobs.model_config(features[c.stream])) for c in cases
    ]
    return (
        f'[broker]\nurl = "{broker_url}"\nclient_id = "bench-learning"\n\n'
        f'[storage]\ndir = "{storage}"\n\n' + "\n".join(tables)
    )


def _toml_table(name: str, table: dict[str, Any]) -> str:
    """``[name]`` with scalar keys and inline tables, then its sub-tables."""
    plain = {k: v for k, v in table.items() if not (isinstance(v, dict) and k != "builder_options")}
    subs = {k: v for k, v in table.items() if k not in plain}
    lines = [f"[{name}]", *(f"{k} = {_toml_value(v)}" for k, v in plain.items())]
    text = "\n".join(lines) + "\n"
    for key, sub in subs.items():
        text += _toml_table(f"{name}.{key}", sub)
    return text


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def server_cases(quick: bool) -> list[Case]:
    """Every stream at livefit's defaults; in full runs also at 0.1's and the recommended ones.

    A side whose effective settings equal an earlier side's is left out.
    """
    sides = [("defaults", DEFAULTS)]
    if not quick:
        sides += [("v0.1 defaults", V01), ("recommended", RECOMMENDED)]
    unique: dict[str, tuple[str, Knobs]] = {}
    for side, knobs in sides:
        unique.setdefault(knobs.key(), (side, knobs))
    suffix = {"defaults": "", "v0.1 defaults": "_v01", "recommended": "_rec"}
    return [
        Case(f"{name}{suffix[side]}", name, side, knobs)
        for name in STREAMS
        for side, knobs in unique.values()
    ]


def through_server(
    streams: dict[str, Stream], cases: Sequence[Case], workdir: Path, log: Callable[[str], None]
) -> dict[str, Score]:
    """Every case's score, through one broker and one ``livefit serve``, one stream at a time."""
    features = {name: s.x.shape[1] for name, s in streams.items()}
    server = LearningServer(workdir, cases, features)
    scores: dict[str, Score] = {}
    with server.running():
        for case in cases:
            scores[case.model] = score = server.feed(case.model, streams[case.stream])
            log(
                f"server {case.stream:<10} {case.side:<13} accuracy {score.accuracy:.4f} "
                f"log loss {score.log_loss:.3f} mean batch {score.extra['mean_batch_size']:.1f} "
                f"({score.seconds:.0f} s)"
            )
    return scores


# -- the defaults sweep ----------------------------------------------------------------------
LEARNING_RATES = (0.001, 0.003, 0.01, 0.03, 0.1)
REPLAYS: dict[str, dict[str, Any]] = {
    "off": {"replay_capacity": 0},
    "reservoir": {"replay_capacity": 2000, "replay_mode": "reservoir", "replay_share": 0.5},
    "window": {"replay_capacity": 2000, "replay_mode": "window", "replay_share": 0.5},
}
# Model seed, and the generators' seed of the synthetic streams:
ROBUSTNESS_SEEDS = (1, 2, 3, 4, 5, 6)
# At livefit's default Page-Hinkley threshold (50) the detector stays silent on these streams,
# so reactions change nothing; at 20 it fires on SEA's concept switches (and a few times more).
SENSITIVE_DRIFT_THRESHOLD = 20.0


@dataclass(slots=True)
class SweepRow:
    """One setting of the sweep on every stream (in-process), and its margins over LR."""

    stage: str
    knobs: Knobs
    stream_seed: int
    scores: dict[str, Score]
    margins: dict[str, float]  # accuracy minus logistic regression's on the same samples

    @property
    def worst(self) -> float:
        return min(self.margins.values())

    @property
    def mean(self) -> float:
        return statistics.fmean(self.margins.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "label": self.knobs.label(),
            "settings": self.knobs.resolved(),
            "seed": self.knobs.seed,
            "stream_seed": self.stream_seed,
            "streams": {k: v.to_json() for k, v in self.scores.items()},
            "margin_to_lr": self.margins,
            "worst_margin": self.worst,
            "mean_margin": self.mean,
        }


class Sweep:
    """A staged grid, in this process; each stage starts from the best settings so far.

    1. builder, optimizer and learning rate (1 step, no replay);
    2. steps per batch and replay, for the best two MLP settings of stage 1;
    3. for the best so far: drift reactions (with a detector sensitive enough to fire), tanh
       hidden units, narrower and wider hidden layers, learning rates between the grid's 0.01
       and 0.03, and no scaling (also for 0.1's defaults, to show what scaling is worth); and
       around the recommended settings, relu or tanh with recent windows of 500, 1000 or 2000
       samples replayed at shares 0.5 or 0.75;
    4. robustness: the best, the recommended, the previous and 0.1's settings again with
       other seeds (model initialisation and, for the synthetic streams, the generators).

    "Best": the largest worst-stream margin over logistic regression, then the largest mean.
    """

    def __init__(
        self,
        streams: dict[str, Stream],
        peers: dict[str, dict[str, Score]],
        log: Callable[[str], None],
        quick: bool = False,
    ) -> None:
        self.log = log
        self.quick = quick
        self.limit = QUICK_SAMPLES if quick else None
        self._streams = {STREAM_SEED: streams}
        self._lr = {STREAM_SEED: {name: p[LR].accuracy for name, p in peers.items()}}
        self.rows: list[SweepRow] = []
        self._seen: dict[tuple[str, int], SweepRow] = {}

    def measure(self, stage: str, knobs: Knobs, stream_seed: int = STREAM_SEED) -> SweepRow:
        """Run ``knobs`` on every stream (once: a repeat returns the row already measured)."""
        key = (knobs.key(), stream_seed)
        if key in self._seen:  # measured already: it counts for this stage too
            row = self._seen[key]
            if stage not in row.stage.split(", "):
                row.stage += f", {stage}"
            return row
        streams, lr = self._at(stream_seed)
        scores = {name: learn_inprocess(s, knobs) for name, s in streams.items()}
        margins = {name: sc.accuracy - lr[name] for name, sc in scores.items()}
        row = self._seen[key] = SweepRow(stage, knobs, stream_seed, scores, margins)
        self.rows.append(row)
        figures = "  ".join(f"{n} {sc.accuracy:.4f}" for n, sc in scores.items())
        self.log(
            f"sweep {stage:<10} {knobs.label():<58} seed {knobs.seed:<2} {figures}  "
            f"worst {100 * row.worst:+.2f} pts"
        )
        return row

    def _at(self, seed: int) -> tuple[dict[str, Stream], dict[str, float]]:
        """The streams generated with ``seed`` and logistic regression's accuracy on them."""
        if seed not in self._streams:
            self._streams[seed] = {
                name: load_stream(spec, self.limit, seed) for name, spec in STREAMS.items()
            }
            self._lr[seed] = {
                name: peer_score(_logistic_regression, s).accuracy
                for name, s in self._streams[seed].items()
            }
        return self._streams[seed], self._lr[seed]

    def run(self) -> SweepRow:
        """Every stage; returns the best row (quick: two settings only, to check the code)."""
        if self.quick:
            return self.best([self.measure("quick", k) for k in (V01, RECOMMENDED)])
        leaders = self._stage_optimizers()
        best = self._stage_updates(leaders)
        best = self._stage_extras(best)
        self._stage_seeds(best)
        return best

    def _stage_optimizers(self) -> list[SweepRow]:
        grid = [("mlp", o) for o in ("adam", "nadam", "sgd")] + [
            ("linear", o) for o in ("adam", "sgd")
        ]
        rows = [
            self.measure(
                "1 optimizer",
                replace(V01, builder=b, activation=None if b == "linear" else "relu",
                        optimizer=o, learning_rate=lr),
            )
            for b, o in grid
            for lr in LEARNING_RATES
        ]  # fmt: skip
        return sorted((r for r in rows if r.knobs.builder == "mlp"), key=_rank)[:2]

    def _stage_updates(self, leaders: list[SweepRow]) -> SweepRow:
        rows = [
            self.measure("2 updates", replace(r.knobs, steps_per_batch=steps, **replay))
            for r in leaders
            for steps in (1, 2, 4)
            for replay in REPLAYS.values()
        ]
        return self.best(rows)

    def _stage_extras(self, best: SweepRow) -> SweepRow:
        rows = [best]
        for reaction in ("reset_optimizer", "boost_lr"):
            knobs = replace(
                best.knobs, drift_reaction=reaction, drift_threshold=SENSITIVE_DRIFT_THRESHOLD
            )
            rows.append(self.measure("3 drift", knobs))
        rows.append(self.measure("3 tanh", replace(best.knobs, activation="tanh")))
        for units in ((32,), (16, 16), (128, 128)):
            rows.append(self.measure("3 width", replace(best.knobs, hidden_units=units)))
        for lr in (0.015, 0.02):
            rows.append(self.measure("3 rate", replace(best.knobs, learning_rate=lr)))
        for activation, capacity, share in itertools.product(
            ("relu", "tanh"), (500, 1000, 2000), (0.5, 0.75)
        ):
            knobs = replace(RECOMMENDED, activation=activation, replay_capacity=capacity,
                            replay_share=share)  # fmt: skip
            rows.append(self.measure("3 window", knobs))
        self.measure("3 scaling", replace(best.knobs, scaling="none"))
        self.measure("3 scaling", replace(V01, scaling="none"))
        return self.best(rows)

    def _stage_seeds(self, best: SweepRow) -> None:
        candidates = {k.key(): k for k in (best.knobs, RECOMMENDED, PREVIOUS, V01)}
        for knobs in candidates.values():
            for seed in ROBUSTNESS_SEEDS:
                self.measure("4 seeds", replace(knobs, seed=seed), stream_seed=seed)

    @staticmethod
    def best(rows: Iterable[SweepRow]) -> SweepRow:
        return sorted(rows, key=_rank)[0]

    def to_json(self, best: SweepRow) -> dict[str, Any]:
        return {
            "criterion": "the largest worst-stream accuracy margin over logistic regression, "
            "then the largest mean margin",
            "why_recommended": WHY_RECOMMENDED,
            "best": best.knobs.label(),
            "best_settings": best.knobs.resolved(),
            "recommended": RECOMMENDED.label(),
            "recommended_settings": RECOMMENDED.resolved(),
            "seeds": self._seed_summary(),
            "rows": [r.to_json() for r in self.rows],
        }

    def _seed_summary(self) -> list[dict[str, Any]]:
        """Per setting measured with several seeds: its accuracy range and worst margin."""
        groups: dict[str, list[SweepRow]] = {}
        for row in self.rows:
            groups.setdefault(replace(row.knobs, seed=MODEL_SEED).key(), []).append(row)
        summary = []
        for rows in groups.values():
            if len(rows) < 2:
                continue
            per_stream = {
                name: {
                    "min": min(r.scores[name].accuracy for r in rows),
                    "max": max(r.scores[name].accuracy for r in rows),
                    "mean_margin": statistics.fmean(r.margins[name] for r in rows),
                    "worst_margin": min(r.margins[name] for r in rows),
                }
                for name in STREAMS
            }
            summary.append(
                {
                    "label": rows[0].knobs.label(),
                    "seeds": [[r.knobs.seed, r.stream_seed] for r in rows],
                    "streams": per_stream,
                    "worst_margin": min(r.worst for r in rows),
                }
            )
        return summary


def _rank(row: SweepRow) -> tuple[float, float]:
    return (-round(row.worst, 4), -row.mean)


# -- the whole benchmark -----------------------------------------------------------------------
def run(
    quick: bool = False,
    sweep: bool = False,
    workdir: Path | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure livefit and the peers on every stream; with ``sweep``, the defaults sweep too.

    Returns plain JSON (see ``markdown``). ``quick``: the first 500 samples of each stream,
    livefit at its defaults only (and two settings in the sweep): checks the harness works,
    not the quality.
    """
    log = log or _print
    started = time.perf_counter()
    own_dir = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="livefit-learning-")) if workdir is None else workdir
    try:
        streams = {
            name: load_stream(spec, QUICK_SAMPLES if quick else None)
            for name, spec in STREAMS.items()
        }
        peers = {name: peer_scores(s) for name, s in streams.items()}
        for name, p in peers.items():
            log(f"peers  {name:<10} " + "  ".join(f"{k} {v.accuracy:.4f}" for k, v in p.items()))
        cases = server_cases(quick)
        served = through_server(streams, cases, workdir / "server", log)
        results = _results(quick, streams, peers, cases, served)
        grid = Sweep(streams, peers, log, quick=quick)
        results["agreement"] = _agreement(grid, cases, served)
        _add_segments(results, grid, cases, peers)
        if sweep:
            sweep_started = time.perf_counter()
            results["sweep"] = grid.to_json(grid.run())
            results["sweep"]["seconds"] = round(time.perf_counter() - sweep_started, 1)
    finally:
        if own_dir:
            shutil.rmtree(workdir, ignore_errors=True)
    results["seconds"] = round(time.perf_counter() - started, 1)
    return results


def _agreement(
    grid: Sweep, cases: Sequence[Case], served: dict[str, Score]
) -> list[dict[str, Any]]:
    """The server's figures next to in-process ones for the same settings and samples."""
    rows = []
    for case in cases:
        inproc = grid.measure("agreement", case.knobs).scores[case.stream]
        server = served[case.model]
        rows.append(
            {
                "stream": case.stream,
                "side": case.side,
                "server": server.accuracy,
                "in_process": inproc.accuracy,
                "difference": server.accuracy - inproc.accuracy,
                "server_mean_batch_size": server.extra.get("mean_batch_size"),
            }
        )
    return rows


def _add_segments(
    results: dict[str, Any], grid: Sweep, cases: Sequence[Case], peers: dict[str, dict[str, Score]]
) -> None:
    """Accuracy over each stream's course: where livefit gains or loses against the peers."""
    for name, stream in results["streams"].items():
        edges = segment_edges(stream["samples"])
        sides = {}
        for case in (c for c in cases if c.stream == name):
            correct = grid.measure("agreement", case.knobs).scores[name].correct
            assert correct is not None
            sides[f"livefit ({case.side})"] = segments(correct, edges)
        for peer, score in peers[name].items():
            assert score.correct is not None
            sides[peer] = segments(score.correct, edges)
        stream["segments"] = {"edges": edges, "sides": sides}


def _results(
    quick: bool,
    streams: dict[str, Stream],
    peers: dict[str, dict[str, Score]],
    cases: Sequence[Case],
    served: dict[str, Score],
) -> dict[str, Any]:
    from bench.harness import machine_facts

    return {
        "name": "learning",
        "title": "Learning quality",
        "mode": "quick" if quick else "full",
        "generated_at": now_iso(),
        "machine": machine_facts(),
        "settings": {
            "samples_per_message": CHUNK,
            "publish_rate_samples_per_s": PUBLISH_RATE,
            "qos": 1,
            "model": "binary classifier: output sigmoid, loss binary_crossentropy, "
            f"metrics accuracy, seed {MODEL_SEED}",
            "defaults": DEFAULTS.resolved(),
            "v01_defaults": V01.resolved(),
            "recommended": RECOMMENDED.resolved(),
            "peers": {name: how for name, (how, _) in PEERS.items()},
            "log_loss": f"-log p(true class), p clipped to [{EPS:g}, 1 - {EPS:g}] on every side",
            "target": TARGET,
        },
        "streams": {
            name: _stream_result(stream, peers[name], cases, served)
            for name, stream in streams.items()
        },
    }


def _stream_result(
    stream: Stream, peers: dict[str, Score], cases: Sequence[Case], served: dict[str, Score]
) -> dict[str, Any]:
    spec = stream.spec
    mine = [c for c in cases if c.stream == spec.name]
    livefit = {c.side: _side(c, served[c.model]) for c in mine}
    default = served[mine[0].model]
    lr = peers[LR].accuracy
    return {
        "title": spec.title,
        "kind": spec.kind,
        "source": spec.source,
        "samples": len(stream),
        "features": list(stream.features),
        "positive_share": float(stream.y.mean()),
        "livefit": livefit["defaults"],
        "livefit_variants": {k: v for k, v in livefit.items() if k != "defaults"},
        "peers": {name: score.to_json() for name, score in peers.items()},
        "difference_to_lr": default.accuracy - lr,
        "ratio_to_lr": default.accuracy / lr if lr else math.nan,
        "target": ">= logistic regression accuracy",
        "pass": default.accuracy >= lr,
    }


def _side(case: Case, score: Score) -> dict[str, Any]:
    return {
        **score.to_json(),
        "settings": case.knobs.resolved(),
        "label": case.knobs.label(),
        "model": case.model,
    }


def write(results: dict[str, Any], json_path: Path, md_path: Path) -> None:
    """The results as JSON at ``json_path`` and the Markdown section at ``md_path``."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=1, allow_nan=True) + "\n")
    md_path.write_text(markdown(results))


# -- Markdown ----------------------------------------------------------------------------------
ANALYSIS = """
**How the defaults were found, and what else was tried.** A per-sample learner makes 25
updates where a minibatch learner fed messages of 25 makes one. With one step per batch and no
replay (the previous defaults) livefit trailed logistic regression by 0.02 and 0.30 points on
SEA and Hyperplane at the reference seeds, all of it in the first few thousand samples (on
Hyperplane 3.8, 1.8 and 1.1 points over the first three tenths; it led by 0.5 to 2.1 over the
last six). What closes the gap is more passes over the recent past: two steps per batch, each
on the new samples plus three times as many replayed from the last 500, with tanh hidden units.
Measured with the server's trainer in this process (margins over logistic regression in points,
worst over the four seeds 42/7, 1/1, 2/2, 3/3 unless said; the sweep and robustness tables
below have more):

| change | Phishing | SEA | Hyperplane |
|---|---|---|---|
| previous defaults (relu, nadam 0.01, 1 step, no replay) | -0.96 | -0.03 | -0.59 |
| **recommended: tanh, 2 steps, window 500 x 0.75** | -0.40 | +0.48 | +0.01 |
| tanh, 2 steps, window 1000 x 0.75 | +0.00 | +0.27 | -0.18 |
| tanh, 2 steps, window 1000 x 0.5 | -0.40 | +0.39 | -0.05 |
| tanh, 2 steps, window 500 x 0.5 | -0.72 | +0.24 | +0.09 |
| tanh, 2 steps, window 2000 x 0.5 / x 0.75 | -0.40 / -0.08 | +0.04 / -0.21 | -0.10 / -0.77 |
| tanh, 2 steps, window 5000 x 0.5 | -0.40 | -0.44 | -0.50 |
| tanh, 3 steps, window 1000 / 2000 x 0.5 | -0.56 / -0.72 | +0.20 / +0.03 | -0.12 / -0.21 |
| tanh, 1 step, window 2000 x 0.5 | -1.04 | -0.31 | -0.24 |
| tanh, 2 steps, no replay | -1.44 | -0.10 | -0.41 |
| relu, 2 steps, window 500 x 0.75 | +0.00 | +0.21 | -0.72 |
| relu, 2 steps, window 1000 x 0.5 / x 0.75 | -0.16 / +0.40 | -0.11 / -0.01 | -0.34 / -0.61 |
| relu, 2 steps, window 2000 x 0.5 / x 0.75 | -0.24 / +0.32 | -0.27 / -0.60 | -0.44 / -0.94 |
| relu, 3 steps, window 2000 x 0.5 | -0.16 | -0.40 | -0.40 |
| tanh, 1 step, no replay | -1.20 | -0.03 | -0.29 |
| tanh, 1 step, no replay, lr 0.015 | -1.04 | -0.12 | -0.28 |
| tanh, 1 step, no replay, 128x128 | -1.68 | -0.23 | -0.36 |
| wide & deep (inputs also feed the output layer) | -1.60 | -0.11 | -0.59 |
| learning rate x3 for the first 40 steps, then 0.01 | -0.64 | -0.08 | -0.36 |
| learning rate x3 for the first 120 steps | -0.64 | -0.13 | -0.33 |
| minibatches of 10 (chunks of 10, not 25) | -0.40 | -0.13 | -0.64 |
| minibatches of 5 | +0.08 | -0.28 | -0.63 |
| SGD at 0.3 / 1.0 (grid stops at 0.1) | -2.24 / -1.68 | -0.25 / -0.69 | -0.95 / -1.30 |
| **LR itself in minibatches of 25** (`linear`, SGD 0.25) | -7.20 | -0.74 | -0.79 |
| LR in minibatches of 25, SGD 0.5 | -3.20 | -0.48 | -0.39 |
| Adagrad 0.1 / 0.3 | -2.00 / -1.84 | -0.19 / -0.31 | -0.77 / -0.53 |
| Adamax 0.02 | -0.48 | -0.25 | -0.74 |
| RMSprop 0.003 | -1.04 | -0.24 | -0.99 |
| AdamW 0.01 | -1.12 | -0.48 | -0.82 |
| Lion 0.001 | -8.16 | -1.33 | -2.12 |
| FTRL 0.3 | -34.64 | -0.96 | -4.41 |
| Nadam, beta_1 0.5 / 0.7 (less momentum lag) | -0.96 / -0.64 | -0.22 / -0.06 | -0.66 / -0.74 |
| Nadam, beta_2 0.99 | -0.96 | -0.09 | -0.62 |
| Nadam, epsilon 1e-3 | -1.36 | -0.06 | -0.60 |
| output layer starts at zero (the first predictions are all 0.5) | -0.72 | -0.13 | -0.53 |
| output layer's initial weights x 0.1 | -1.12 | -0.06 | -0.48 |
| He-normal hidden layers (Glorot-uniform is Keras' default) | -1.60 | -0.69 | -1.32 |

The rows from "wide & deep" down change the previous defaults (relu, 1 step, no replay). The
recommended settings were then checked on six seeds not used to choose them (4/4, 5/5, 6/6,
8/8, 9/9, 10/10): mean margins +0.21, +0.58 and +0.06 points, worst -0.48, +0.34 and -0.15,
against -0.33, -0.00 and -0.43 (worst -1.20, -0.23, -0.81) for the previous defaults; the
window of 1000 had means +0.52, +0.40 and -0.08. A short window works on both drifting
streams because it forgets the concept that drifted away; a high share helps the small real
dataset (more passes over it). Logistic regression itself, fed the same minibatches of 25,
trails its per-sample self by 0.4 to 0.8 points on SEA and Hyperplane and 3 to 7 on Phishing:
that is what minibatches cost before replay. Cost: each caught-up batch takes two steps on
four times its samples; under a backlog (a batch that leaves samples queued) the trainer takes
one plain step per batch (`train.extras_when`), so the trainer benchmark's throughput is not
affected. Phishing is a fixed dataset (1,250 samples) and its margin depends on the model
seed alone: the recommended settings lead logistic regression there on average but trail it
with some seeds (by up to 0.48 points), as does Hyperplane with some (by up to 0.15).
"""


def markdown(results: dict[str, Any]) -> str:
    """The "Learning quality" section of BENCHMARKS.md for ``results`` (from ``run``)."""
    parts = [_md_intro(results), _md_summary(results)]
    if results["mode"] != "quick":
        parts.append(ANALYSIS.strip() + "\n")
    parts += [_md_stream(stream) for stream in results["streams"].values()]
    if "sweep" in results:
        parts += [_md_sweep(results["sweep"]), _md_seeds(results["sweep"])]
    if "agreement" in results:
        parts.append(_md_agreement(results["agreement"]))
    parts.append(_md_machine(results))
    return "\n".join(p for p in parts if p).rstrip() + "\n"


def _md_intro(results: dict[str, Any]) -> str:
    s = results["settings"]
    quick = (
        "\n**Quick mode**: the first 500 samples of each stream; this checks the harness, "
        "not the quality.\n"
        if results["mode"] == "quick"
        else ""
    )
    intro = (__doc__ or "").split("\n\n", 2)[2].split("\n\nThe defaults sweep")[0]
    return (
        "## Learning quality\n\n"
        f"{intro.strip()}\n\n"
        f"Target: {s['target']}. livefit's defaults in this run: "
        f"{describe(s['defaults'])}. Every livefit model: {s['model']}. Log loss: {s['log_loss']}."
        f" Messages of {s['samples_per_message']} samples, QoS {s['qos']}, published at "
        f"{s['publish_rate_samples_per_s']:g} samples/s.\n{quick}"
    )


def _md_summary(results: dict[str, Any]) -> str:
    lines = [
        "| stream | samples | livefit (defaults) | logistic regression | Hoeffding tree "
        "| livefit - LR | target | result |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["streams"].values():
        lines.append(
            f"| {r['title']} | {r['samples']:,} | {_pct(r['livefit']['accuracy'])} | "
            f"{_pct(r['peers'][LR]['accuracy'])} | {_pct(r['peers'][HT]['accuracy'])} | "
            f"{_pts(r['difference_to_lr'])} | ≥ LR | {'pass' if r['pass'] else '**miss**'} |"
        )
    return "Prequential accuracy (cumulative, test-then-train):\n\n" + "\n".join(lines) + "\n"


def _md_stream(r: dict[str, Any]) -> str:
    lr = r["peers"][LR]["accuracy"]
    lines = [
        f"### {r['title']}\n",
        f"{r['source']}; {r['samples']:,} samples, {len(r['features'])} features, "
        f"{r['positive_share']:.0%} positive.\n",
        "| side | settings | accuracy | log loss | vs LR | updates | mean batch | drifts |",
        "|---|---|---|---|---|---|---|---|",
    ]
    sides = {"livefit (defaults)": r["livefit"]}
    sides.update({f"livefit ({k})": v for k, v in r["livefit_variants"].items()})
    for name, s in sides.items():
        lines.append(
            f"| {name} | {s['label']} | {_pct(s['accuracy'])} | {s['log_loss']:.3f} | "
            f"{_pts(s['accuracy'] - lr)} | {s.get('steps', '')} | "
            f"{_num(s.get('mean_batch_size'))} | {s.get('drift_detections', '')} |"
        )
    for name, p in r["peers"].items():
        how = PEERS[name][0].replace("|", "\\|") if name in PEERS else ""
        lines.append(
            f"| river {name} | {how}, per sample | {_pct(p['accuracy'])} | "
            f"{p['log_loss']:.3f} | {_pts(p['accuracy'] - lr)} | {p['samples']:,} | 1 | |"
        )
    return "\n".join(lines) + "\n" + _md_segments(r.get("segments"))


def _md_segments(seg: dict[str, Any] | None) -> str:
    """Accuracy within stretches of the stream (livefit in-process, same settings and order)."""
    if not seg:
        return ""
    edges = seg["edges"]
    spans = [f"{a:,}{DASH}{b:,}" for a, b in itertools.pairwise(edges) if b > a]
    lines = [
        "\nAccuracy within stretches of the stream (livefit in-process):\n",
        "| side | " + " | ".join(spans) + " |",
        "|---|" + "---|" * len(spans),
    ]
    for side, values in seg["sides"].items():
        lines.append(f"| {side} | " + " | ".join(_pct(v) for v in values) + " |")
    mine, lr = seg["sides"].get("livefit (defaults)"), seg["sides"].get(LR)
    if mine and lr:
        n = edges[-1]
        shares = [
            (a - b) * (hi - lo) / n
            for a, b, (lo, hi) in zip(mine, lr, itertools.pairwise(edges), strict=False)
        ]
        cells = " | ".join(_pts(v) for v in shares)
        lines.append(f"| livefit (defaults) - LR, share of the whole | {cells} |")
    return "\n".join(lines) + "\n"


def _md_sweep(sweep: dict[str, Any]) -> str:
    names = list(sweep["rows"][0]["streams"]) if sweep["rows"] else []
    head = " | ".join(STREAMS[n].title if n in STREAMS else n for n in names)
    lines = [
        "### Defaults sweep\n",
        "In-process (the server's trainer, chunks of 25, no MQTT); prequential accuracy per "
        "stream, Δ = accuracy minus logistic regression's. "
        f"Criterion: {sweep['criterion']}. Best: **{sweep['best']}**; "
        f"recommended: **{sweep['recommended']}**. Sweep time: {sweep['seconds']:.0f} s.\n",
        f"{sweep.get('why_recommended', '')}\n",
        f"| stage | settings | seeds | {head} | worst Δ | mean Δ | s |",
        "|---|---|---|" + "---|" * len(names) + "---|---|---|",
    ]
    for row in sweep["rows"]:
        figures = " | ".join(_pct(row["streams"][n]["accuracy"]) for n in names)
        seconds = sum(row["streams"][n]["seconds"] for n in names)
        lines.append(
            f"| {row['stage']} | {row['label']} | {row['seed']}/{row['stream_seed']} | {figures} | "
            f"{_pts(row['worst_margin'])} | {_pts(row['mean_margin'])} | {seconds:.0f} |"
        )
    return "\n".join(lines) + "\n"


def _md_seeds(sweep: dict[str, Any]) -> str:
    if not sweep["seeds"]:
        return ""
    names = [n for n in STREAMS if n in sweep["seeds"][0]["streams"]]
    lines = [
        "Robustness: the same settings with other seeds (model initialisation, and the "
        "synthetic generators); accuracy min\u2013max, mean margin over LR on the same samples:\n",
        "| settings | seeds (model / stream) | "
        + " | ".join(STREAMS[n].title for n in names)
        + " | worst Δ |",
        "|---|---|" + "---|" * len(names) + "---|",
    ]
    for s in sweep["seeds"]:
        cells = " | ".join(
            f"{_pct(s['streams'][n]['min'])}{DASH}{_pct(s['streams'][n]['max'])} "
            f"(mean {_pts(s['streams'][n]['mean_margin'])})"
            for n in names
        )
        seeds = ", ".join(f"{m}/{t}" for m, t in s["seeds"])
        lines.append(f"| {s['label']} | {seeds} | {cells} | {_pts(s['worst_margin'])} |")
    return "\n".join(lines) + "\n"


def _md_agreement(rows: list[dict[str, Any]]) -> str:
    lines = [
        "Through the server vs in-process, same settings (the sweep's figures stand for the "
        "server's when these agree):\n",
        "| stream | settings | server | in-process | difference | server mean batch |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['stream']} | {r['side']} | {_pct(r['server'])} | {_pct(r['in_process'])} | "
            f"{_pts(r['difference'])} | {_num(r['server_mean_batch_size'])} |"
        )
    return "\n".join(lines) + "\n"


def _md_machine(results: dict[str, Any]) -> str:
    m = results["machine"]
    return (
        f"Run {results['generated_at']} in {results['seconds']:.0f} s ({results['mode']} mode) "
        f"on {m.get('cores_usable')} cores, {m.get('cpu_model')}, {m.get('device')}, "
        f"TensorFlow {m.get('tensorflow')}, livefit {m.get('livefit')} "
        f"(commit {m.get('commit')}).\n"
    )


def _pct(value: float | None) -> str:
    return DASH if value is None or math.isnan(value) else f"{100 * value:.2f} %"


def _pts(value: float) -> str:
    return f"{100 * value:+.2f} pts"


def _num(value: float | None) -> str:
    return "" if value is None or math.isnan(value) else f"{value:.1f}"


# -- the suite's interface -------------------------------------------------------------------
def suite_run(ctx: Context) -> BenchResult:
    """This benchmark for ``python -m bench`` (``bench.cli``): the same run, as a BenchResult."""
    results = run(quick=ctx.quick, sweep=True, workdir=ctx.workdir, log=ctx.step)
    return to_bench_result(results)


def to_bench_result(results: dict[str, Any]) -> BenchResult:
    """One row per stream: accuracies of every side, livefit ÷ LR, the target on it."""
    from bench.harness import BenchResult, Row, Spread

    result = BenchResult(
        name="learning",
        title="Learning quality",
        what=_md_intro(results).split("\n\n", 1)[1].strip(),
        sides={"livefit": describe(results["settings"]["defaults"]),
               **{f"river {k}": v for k, v in results["settings"]["peers"].items()}},
        settings={k: v for k, v in results["settings"].items() if k not in ("peers", "defaults")},
        extra={"learning": results},
    )  # fmt: skip
    for r in results["streams"].values():
        row = Row(case={"stream": r["title"]})
        row.figures["livefit accuracy"] = Spread.of([r["livefit"]["accuracy"]], "")
        for name, p in r["peers"].items():
            row.figures[f"{name} accuracy"] = Spread.of([p["accuracy"]], "")
        row.ratios["livefit ÷ logistic regression"] = Spread.of([r["ratio_to_lr"]], "x")
        row.target("livefit ÷ logistic regression", ">=", 1.0, "≥ logistic regression")
        result.rows.append(row)
    return result


# -- command line ----------------------------------------------------------------------------
def _print(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.learning", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="500 samples a stream: the harness")
    parser.add_argument("--sweep", action="store_true", help="also the defaults sweep")
    parser.add_argument("--json", metavar="PATH", help="results (default bench/results/...)")
    parser.add_argument("--markdown", metavar="PATH", help="Markdown section to write")
    args = parser.parse_args(argv)
    stem = "learning-quick" if args.quick else "learning"
    json_path = Path(args.json or REPO / "bench" / "results" / f"{stem}.json")
    md_path = Path(args.markdown or json_path.with_suffix(".md"))
    results = run(quick=args.quick, sweep=args.sweep)
    write(results, json_path, md_path)
    _print(f"wrote {json_path} and {md_path} ({results['seconds']:.0f} s)")
    for r in results["streams"].values():
        verdict = "pass" if r["pass"] else "MISS"
        _print(
            f"{r['title']:<28} livefit {_pct(r['livefit']['accuracy'])}  "
            f"LR {_pct(r['peers'][LR]['accuracy'])}  HT {_pct(r['peers'][HT]['accuracy'])}  "
            f"{verdict}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
