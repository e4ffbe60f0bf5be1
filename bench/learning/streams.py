"""The public streams of the learning benchmark: river's datasets and generators, in a fixed
order, as river's rows (for the peers) and float arrays (for livefit)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

CHUNK = 25  # samples per MQTT message, and per minibatch when the trainer keeps up
QUICK_SAMPLES = 200  # quick runs: 8 messages a stream, enough to check the harness
STREAM_SEED = 42

Rows = Iterable[tuple[dict[str, Any], Any]]
BINARY, MULTICLASS, REGRESSION = "binary", "multiclass", "regression"
LOSSES = {
    BINARY: "binary_crossentropy",
    MULTICLASS: "sparse_categorical_crossentropy",
    REGRESSION: "mse",
}
METRIC = {BINARY: "accuracy", MULTICLASS: "accuracy", REGRESSION: "mae"}


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
    task: str = BINARY


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


def _image_segments(seed: int) -> Rows:
    from river import datasets

    return datasets.ImageSegments()


def _trump_approval(seed: int) -> Rows:
    from river import datasets

    return datasets.TrumpApproval()


def _chick_weights(seed: int) -> Rows:
    from river import datasets

    return datasets.ChickWeights()


def _friedman(seed: int) -> Rows:
    from river.datasets import synth

    return synth.FriedmanDrift(drift_type="gra", position=(3_500, 7_000), seed=seed).take(10_000)


def _sine(seed: int) -> Rows:
    from river.datasets import synth

    return synth.Sine(classification_function=0, seed=seed).take(4000)


def _agrawal_switch(seed: int, width: int) -> Rows:
    """Agrawal's function 0 (salary by age) switching to function 2 at sample 3,000."""
    from river.datasets import synth

    return synth.ConceptDriftStream(
        stream=synth.Agrawal(classification_function=0, seed=seed),
        drift_stream=synth.Agrawal(classification_function=2, seed=seed + 1),
        position=3000,
        width=width,
        seed=seed,
    ).take(6000)


def _agrawal_abrupt(seed: int) -> Rows:
    return _agrawal_switch(seed, 20)  # river's sigmoid overflows below ~17; 20 is abrupt


def _agrawal_gradual(seed: int) -> Rows:
    return _agrawal_switch(seed, 1000)


def _waveform(seed: int) -> Rows:
    from river.datasets import synth

    return synth.Waveform(seed=seed).take(4000)


def _led(seed: int) -> Rows:
    from river.datasets import synth

    return synth.LED(seed=seed, noise_percentage=0.1).take(4000)


def _planes2d(seed: int) -> Rows:
    from river.datasets import synth

    return synth.Planes2D(seed=seed).take(4000)


def _rbf_drift(seed: int) -> Rows:
    from river.datasets import synth

    return synth.RandomRBFDrift(
        seed_model=seed, seed_sample=seed, n_features=10, n_centroids=50, change_speed=0.001,
        n_drift_centroids=50,
    ).take(4000)  # fmt: skip


MV_CATEGORIES = {3: ("brown", "green", "red"), 7: ("no", "yes"), 8: ("large", "normal")}


def _mv_one_hot(seed: int) -> Rows:
    """river's Mv with its three nominal features one-hot encoded (the same rows for all)."""
    from river.datasets import synth

    for x, y in synth.Mv(seed=seed).take(4000):
        row: dict[str, Any] = {}
        for key, value in x.items():
            if key in MV_CATEGORIES:
                row.update({f"{key}={c}": float(value == c) for c in MV_CATEGORIES[key]})
            else:
                row[str(key)] = value
        yield row, y


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
        StreamSpec(
            "segments",
            "Image segments (real, 7 classes)",
            "real dataset, multi-class",
            "`river.datasets.ImageSegments()`",
            2310,
            _image_segments,
            seeded=False,
            task=MULTICLASS,
        ),
        StreamSpec(
            "trump",
            "TrumpApproval (real, regression)",
            "real dataset, regression",
            "`river.datasets.TrumpApproval()`",
            1001,
            _trump_approval,
            seeded=False,
            task=REGRESSION,
        ),
        StreamSpec(
            "chick",
            "ChickWeights (real, regression)",
            "real dataset, regression",
            "`river.datasets.ChickWeights()`",
            578,
            _chick_weights,
            seeded=False,
            task=REGRESSION,
        ),
        StreamSpec(
            "friedman",
            "Friedman (recurring drift, regression)",
            "synthetic, abrupt recurring drift, regression",
            '`synth.FriedmanDrift(drift_type="gra", position=(3500, 7000), seed=42).take(10000)`',
            10_000,
            _friedman,
            task=REGRESSION,
        ),
        StreamSpec(
            "sine",
            "Sine (2-D nonlinear)",
            "synthetic, nonlinear boundary, 2 features",
            "`synth.Sine(classification_function=0, seed=42).take(4000)`",
            4000,
            _sine,
        ),
        StreamSpec(
            "agrawal_abrupt",
            "Agrawal, abrupt switch",
            "synthetic, one abrupt drift at 3,000",
            "`synth.ConceptDriftStream(stream=synth.Agrawal(classification_function=0, seed=42), "
            "drift_stream=synth.Agrawal(classification_function=2, seed=43), position=3000, "
            "width=20, seed=42).take(6000)`",
            6000,
            _agrawal_abrupt,
        ),
        StreamSpec(
            "agrawal_gradual",
            "Agrawal, gradual switch",
            "synthetic, one gradual drift over 2,500-3,500",
            "`synth.ConceptDriftStream(stream=synth.Agrawal(classification_function=0, seed=42), "
            "drift_stream=synth.Agrawal(classification_function=2, seed=43), position=3000, "
            "width=1000, seed=42).take(6000)`",
            6000,
            _agrawal_gradual,
        ),
        StreamSpec(
            "rbf_drift",
            "Moving RBF (incremental drift)",
            "synthetic, moving centroids",
            "`synth.RandomRBFDrift(seed_model=42, seed_sample=42, n_features=10, n_centroids=50, "
            "change_speed=0.001, n_drift_centroids=50).take(4000)`",
            4000,
            _rbf_drift,
        ),
        StreamSpec(
            "waveform",
            "Waveform (3 classes, 21 noisy features)",
            "synthetic, multi-class",
            "`synth.Waveform(seed=42).take(4000)`",
            4000,
            _waveform,
            task=MULTICLASS,
        ),
        StreamSpec(
            "led",
            "LED (10 classes, 7 boolean features)",
            "synthetic, multi-class, 10 % noise",
            "`synth.LED(seed=42, noise_percentage=0.1).take(4000)`",
            4000,
            _led,
            task=MULTICLASS,
        ),
        StreamSpec(
            "planes2d",
            "Planes2D (piecewise-linear regression)",
            "synthetic, regression",
            "`synth.Planes2D(seed=42).take(4000)`",
            4000,
            _planes2d,
            task=REGRESSION,
        ),
        StreamSpec(
            "mv",
            "Mv (one-hot regression)",
            "synthetic, regression, 3 nominal features one-hot encoded",
            "`synth.Mv(seed=42).take(4000)`, features 3, 7 and 8 one-hot encoded",
            4000,
            _mv_one_hot,
            task=REGRESSION,
        ),
    )
}
DRIFTS = {
    "sea": (5000, 10000, 15000),
    "friedman": (3500, 7000),
    "agrawal_abrupt": (3000,),
    "agrawal_gradual": (3000,),
}
"""Where a stream's concept changes (the middle of a gradual change): recovery is measured
from there."""
BINARY_STREAMS = tuple(name for name, s in STREAMS.items() if s.task == BINARY)
# The defaults sweep's streams: the first three binary ones (the sweep that chose the update
# policy); the later streams are measured at the defaults and in the seeds, not swept.
SWEEP_STREAMS = ("phishing", "sea", "hyperplane")
# Quick runs (the harness check in the suite): the sweep's streams and one stream of each other
# task, so that every path (binary, several classes, regression; server, in-process, sweep)
# runs. All fifteen took about 110 s of CPU on 2 cores, these five about 45 s; every stream's
# rows are checked apart (tests/e2e/test_bench_learning.py, without learning on them).
QUICK_STREAMS = (*SWEEP_STREAMS, "segments", "trump")


@dataclass(frozen=True, slots=True)
class Stream:
    """A stream's samples: river's rows for the peers, float arrays in a fixed order for livefit."""

    spec: StreamSpec
    seed: int
    rows: list[tuple[dict[str, Any], Any]]  # labels: bool, a class name, or a float
    features: tuple[str, ...]
    x: np.ndarray  # (n, features) float32
    y: np.ndarray  # (n, 1) float32: 0 or 1, or the target; (n,) class indices for multi-class
    classes: tuple[Any, ...] = ()  # the labels of a classifier's outputs, in order

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def task(self) -> str:
        return self.spec.task

    def table(self) -> dict[str, Any]:
        """What a user writes for this stream's model: the shapes and the loss."""
        outputs = len(self.classes) if self.task == MULTICLASS else 1
        return {
            "input_shape": [int(self.x.shape[1])],
            "output_shape": [outputs],
            "loss": LOSSES[self.task],
        }


def load_stream(spec: StreamSpec, limit: int | None = None, seed: int = STREAM_SEED) -> Stream:
    """The first ``limit`` samples of ``spec`` (all of them by default), generated with ``seed``."""
    if spec.seeded:
        made = list(itertools.islice(spec.make(seed), limit or spec.samples))
    else:  # river's file datasets close their file only once read to the end
        made = list(spec.make(seed))[: limit or spec.samples]
    features = tuple(made[0][0])
    x = np.array([[float(r[k]) for k in features] for r, _ in made], dtype=np.float32)
    classes: tuple[Any, ...] = ()
    rows: list[tuple[dict[str, Any], Any]]
    if spec.task == BINARY:
        rows = [(r, bool(label)) for r, label in made]
        y = np.array([[float(label)] for _, label in rows], dtype=np.float32)
        classes = (False, True)
    elif spec.task == MULTICLASS:
        rows = list(made)
        classes = tuple(sorted({label for _, label in rows}, key=str))
        index = {label: i for i, label in enumerate(classes)}
        y = np.array([index[label] for _, label in rows], dtype=np.float32)
    else:
        rows = [(r, float(label)) for r, label in made]
        y = np.array([[label] for _, label in rows], dtype=np.float32)
    return Stream(spec, seed if spec.seeded else STREAM_SEED, rows, features, x, y, classes)
