"""The first version a learner trains is served as soon as any later one, in both layouts
(issue #47, "no stale start").

The first labelled data after a start used to wait behind a training step that built its
kernels again: the step was warmed up before the learner built its other Keras models (the
one-process learner's serving copy, the next model), and building a model with a seed sets
TensorFlow's global seed, which empties its kernel caches. Version 0 was served meanwhile
(0.34-0.44 s of the delayed-labels benchmark's streams; seconds on 2 busy cores).

A client predicts continuously from two models of one learner, both seeded (as the benchmarks
run them) and each an MLP of eight narrow layers: the kernel build of its step costs seconds of
CPU and its steps milliseconds, so a lost warm-up stands out on a loaded machine too. Then the
first model gets a delayed label for a prediction it answered, the second a plain sample
message (only the first ``1 + LATER`` predictions carry ids, and the labels start once the
learner holds all their records: a serving process's recorder connects on its first record,
which on a loaded machine can take longer than any fixed pause, and a label that comes before
its record waits for it). For each, the first answer naming a version >= 1 must come at most
``BOUND_S`` later after its publish than a later version comes after its own (the median of
``LATER`` more messages, each ``PAUSE_S`` after the one before, in the same run). The first
step's own duration (``livefit_train_batch_seconds``) is in the failure message.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from livefit.clients.predict import PredictClient
from livefit.clients.publisher import SamplePublisher
from livefit.local_servers import LivefitProcess
from livefit.server.runtime.mosquitto import Mosquitto
from tests import configs
from tests.layouts import in_both_layouts, metric

LABELLED, SAMPLED = "labelled", "sampled"  # the first model learns labels, the second samples
NETWORK = "builder_options = { hidden_units = [8, 8, 8, 8, 8, 8, 8, 8] }"
ROW = [0.5, -1.0]
BOUND_S = 1.0  # a lost warm-up costs this model's first step 1.4-9 s; busy cores' noise 0.4 s
LATER = 3
PAUSE_S = 0.5  # between messages: more than weights.serve_interval_s, so no snapshot waits


@dataclass(frozen=True, slots=True)
class Answer:
    at: float  # time.monotonic() when it came
    version: int
    id: str


class Predictor:
    """Predicts one row from each model in turn until stopped, keeping every answer; the first
    ``recorded`` rows of each model carry an id (their records are kept for delayed labels)."""

    def __init__(self, url: str, models: tuple[str, ...], recorded: int) -> None:
        self.url = url
        self.models = models
        self.recorded = recorded
        self.answers: dict[str, list[Answer]] = {m: [] for m in models}
        self.failure: Exception | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="predictor", daemon=True)

    def __enter__(self) -> Predictor:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopping.set()
        self._thread.join(30)

    def _run(self) -> None:
        try:
            with PredictClient(self.url) as client:
                n = 0
                while not self._stopping.is_set():
                    for model in self.models:
                        row_id = f"{model}-{n}"
                        rows = np.array([ROW], np.float32)
                        ids: list[str | int] | None = [row_id] if n < self.recorded else None
                        result = client.predict(model, rows, ids=ids)
                        self.answers[model].append(Answer(time.monotonic(), result.version, row_id))
                    n += 1
                    self._stopping.wait(0.005)
        except Exception as exc:  # the test's waits report it
            self.failure = exc

    def answered(self, model: str, count: int) -> list[Answer]:
        """``model``'s answers once it has at least ``count``."""
        deadline = time.monotonic() + 60
        while len(self.answers[model]) < count and time.monotonic() < deadline:
            self._check()
            time.sleep(0.01)
        assert len(self.answers[model]) >= count, f"{model}: {len(self.answers[model])} answers"
        return self.answers[model]

    def _check(self) -> None:
        if self.failure is not None:
            raise AssertionError(f"predictions failed: {self.failure!r}") from self.failure

    def first_newer(self, model: str, since: float, version: int, timeout: float = 60) -> float:
        """When the first answer from ``model`` after ``since`` named a version above
        ``version``."""
        deadline = time.monotonic() + timeout
        checked = 0
        while time.monotonic() < deadline:
            self._check()
            new = self.answers[model][checked:]
            for answer in new:
                if answer.at > since and answer.version > version:
                    return answer.at
            checked += len(new)
            time.sleep(0.002)
        raise AssertionError(f"{model}: no version above {version} answered in {timeout:.0f} s")


def latency(predictor: Predictor, model: str, send: Callable[[], None]) -> tuple[float, int]:
    """Seconds from ``send()`` to the first answer naming a newer version; the version served
    before it."""
    served = predictor.answered(model, 1)[-1].version
    sent = time.monotonic()
    send()
    return predictor.first_newer(model, sent, served) - sent, served


def records_reached(learner: LivefitProcess, model: str, count: int) -> None:
    """Waits until the learner holds ``count`` prediction records of ``model``."""
    deadline = time.monotonic() + 60
    while metric(learner, "livefit_pending_predictions", model=model) < count:
        assert time.monotonic() < deadline, f"{model}: the learner got no {count} records"
        time.sleep(0.02)


def config(broker: Mosquitto, storage: Path, layout: str) -> str:
    models = [
        configs.model(name, "mlp", [2], lines=f"seed = 3\n{NETWORK}", labels="ttl_s = 3600")
        for name in (LABELLED, SAMPLED)
    ]
    return configs.learner_config(
        broker, storage, f"first-version-{broker.port}-{layout[:3]}", *models, layout=layout
    )


@in_both_layouts()
def test_the_first_trained_version_is_served_as_soon_as_later_ones(
    broker: Mosquitto, tmp_path: Path, layout: str
) -> None:
    learner = LivefitProcess(config(broker, tmp_path / "data", layout), tmp_path)
    learner.start(ready_timeout_s=240)
    labels = SamplePublisher(broker.url, f"livefit/{LABELLED}/labels", fmt="json")
    samples = SamplePublisher(broker.url, f"livefit/{SAMPLED}/samples", fmt="json")
    try:
        predictor = Predictor(learner.url, (LABELLED, SAMPLED), recorded=1 + LATER)
        with labels, samples, predictor:
            recorded = predictor.answered(LABELLED, 1 + LATER)[: 1 + LATER]
            records_reached(learner, LABELLED, len(recorded))

            def label() -> None:  # the next of the predictions answered first
                payload = {"id": [recorded.pop(0).id], "y": [[0.25]]}
                labels.publish_payload(json.dumps(payload).encode())

            def sample() -> None:
                samples.publish(np.array([ROW]), np.array([[0.25]]), batched=True)

            sends = {LABELLED: label, SAMPLED: sample}
            first: dict[str, tuple[float, int]] = {}
            step_s: dict[str, float] = {}
            for model, send in sends.items():
                first[model] = latency(predictor, model, send)
                step_s[model] = metric(learner, "livefit_train_batch_seconds_sum", model=model)
            later: dict[str, list[float]] = {model: [] for model in sends}
            for _ in range(LATER):
                for model, send in sends.items():
                    time.sleep(PAUSE_S)
                    later[model].append(latency(predictor, model, send)[0])
    finally:
        learner.stop()
    figures = {
        model: f"first version {first[model][0] * 1000:.0f} ms after its message (its step "
        f"{step_s[model] * 1000:.0f} ms), later ones "
        f"{', '.join(f'{s * 1000:.0f}' for s in later[model])} ms"
        for model in sends
    }
    print(layout, figures)
    for model in sends:
        assert first[model][1] == 0, f"{model} served v{first[model][1]} before any data"
        steady = statistics.median(later[model])
        assert first[model][0] <= steady + BOUND_S, f"{layout}, {model}: {figures[model]}"
