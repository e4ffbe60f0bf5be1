"""Benchmark 4, freshness: from a sample's publish to a replica serving weights trained on it.

A learner in one process and a replica (``livefit serve`` with ``http.workers = 0`` and
``livefit replica``, otherwise default settings: weights published every 0.5 s at most) on a
mosquitto started here; then a split learner (``http.workers = 1``) on its own mosquitto,
probed through its own serving process (weights over the local socket instead of the weight
topic). A probe:

1. waits a random 0-0.5 s, so probes land at every phase of the 0.5 s publish interval;
2. reads the learner's training version ``v0`` (``livefit_model_version``);
3. publishes one sample (QoS 1, ``ts`` stamped) and starts the clock;
4. sends one-row predictions to the replica, back to back, until an answer's ``model_version``
   exceeds ``v0``; the clock stops at that answer.

Why this is sound: probes are the only samples and go one at a time, so every training step
after ``v0`` is a step of the probe's batch (the default update policy takes two), each on the
probe (checked: when the probe is seen, the learner has trained exactly one more sample than
at ``v0``). A replica answer computed with version ``> v0`` therefore comes from weights that
include the probe, and nothing earlier can. The time
includes MQTT in, the trainer's step, the wait for the next snapshot, encoding, the weight
topic, the replica's checks and swap, and one batched prediction (2 ms batch timeout).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass

import httpx
import numpy as np

from bench.harness import Benchmark, BenchResult, Context, Row, Sizes, Spread
from bench.models import MLP, ModelSpec
from livefit.local_servers import LivefitProcess

MODEL = "fresh"


def run(ctx: Context) -> BenchResult:
    probes = ctx.sizes["probes"]
    result = _result(MLP, probes)
    with ctx.fleet(MODEL, replica=True) as fleet:
        assert fleet.replica is not None
        target = _Target(fleet.learner, fleet.replica.url, {"model": MODEL})
        _measure(ctx, result, "learner + replica", target, fleet.broker.url, probes)
        text = fleet.learner.config.read_text()
        with ctx.split_learner(text, "split-learner") as (broker, split):
            labels = {"model": MODEL, "worker": "training"}
            target = _Target(split, split.url, labels)
            _measure(ctx, result, "split learner's own serving process", target, broker.url,
                     probes)  # fmt: skip
    return result


@dataclass(frozen=True)
class _Target:
    """Where a probe reads the training version (``learner``'s series with ``labels``) and
    where it asks for predictions (``serving_url``)."""

    learner: LivefitProcess
    serving_url: str
    labels: dict[str, str]


def _measure(
    ctx: Context, result: BenchResult, side: str, target: _Target, broker_url: str, probes: int
) -> None:
    from livefit.clients.publisher import SamplePublisher

    times: list[float] = []
    sound_probes = 0
    rng = random.Random(5)
    x, y = MLP.rows(probes, seed=9), np.zeros((probes, 1), dtype=np.float32)
    publisher = SamplePublisher(broker_url, f"livefit/{MODEL}/samples", fmt="json", source="bench")
    publisher.connect()
    try:
        with httpx.Client(timeout=10) as http:
            for i in range(probes):
                time.sleep(rng.uniform(0.0, 0.5))
                seconds, sound = _probe(target, http, publisher, x[i], y[i])
                times.append(seconds)
                sound_probes += sound
                if (i + 1) % max(1, probes // 10) == 0:
                    ctx.step(
                        f"{side}: probe {i + 1}/{probes}: median so far "
                        f"{np.median(times) * 1e3:.0f} ms, max {max(times) * 1e3:.0f} ms"
                    )
    finally:
        publisher.close()
    result.check(
        f"{side}: each probe was the only sample trained after v0 (the version test is sound)",
        sound_probes == probes,
        f"{sound_probes} of {probes}",
    )
    result.check(f"{side}: every probe was served", all(t < float("inf") for t in times))
    row = Row(case={"settings": "defaults", "served by": side})
    row.figures["p50 s"] = _percentile(times, 50)
    row.figures["p90 s"] = _percentile(times, 90)
    row.figures["p99 s"] = _percentile(times, 99)
    row.figures["max s"] = Spread.of([max(times)], "s")
    if side.startswith("split"):
        row.target("p99 s", "<=", 0.25, "p99 ≤ 250 ms to the learner's own serving processes")
    else:
        row.target("p99 s", "<=", 1.0, "p99 ≤ 1 s")
    result.rows.append(row)
    result.extra[f"seconds ({side})"] = times


def _result(spec: ModelSpec, probes: int) -> BenchResult:
    """The result, before any measurement: sides and settings."""
    return BenchResult(
        name="freshness",
        title="Freshness: publish to served",
        what=__doc__.split("\n", 2)[2].strip(),
        sides={
            "learner + replica": "learner (one process, `http.workers = 0`) + replica, "
            "otherwise default settings (`weights.publish_interval_s` 0.5, "
            "`train.max_wait_ms` 0)",
            "split learner's own serving process": "`livefit serve` with `http.workers = 1`, "
            "otherwise default settings; predictions asked of the learner's port",
        },
        settings={
            "model": spec.describe(),
            "probes": probes,
            "ranges": "bootstrap 95% intervals over the probes",
        },
    )


def _probe(target: _Target, http: httpx.Client, publisher, x, y) -> tuple[float, bool]:  # type: ignore[no-untyped-def]
    learner, labels = target.learner, target.labels
    v0 = _present(learner, "livefit_model_version", labels)
    trained0 = _present(learner, "livefit_train_samples_total", labels)
    body = json.dumps({"instances": [x.tolist()]}).encode()
    url = f"{target.serving_url}/v1/models/{MODEL}:predict"
    started = time.time()
    publisher.publish(x, y, batched=False)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        answer = http.post(url, content=body, headers={"content-type": "application/json"})
        if answer.status_code == 200 and int(answer.json()["model_version"]) > v0:
            seconds = time.time() - started
            trained = _present(learner, "livefit_train_samples_total", labels)
            return seconds, trained == trained0 + 1
    return float("inf"), False


def _present(learner: LivefitProcess, name: str, labels: dict[str, str]) -> float:
    """The sample's value once a scrape has it. A split learner's merged ``/metrics`` leaves
    out a process that did not answer in time, and a missing series must not read as 0 (a
    version of 0 would make any answer look fresh)."""
    key = (name, tuple(sorted(labels.items())))
    deadline = time.monotonic() + 30.0
    while (value := learner.metrics().get(key)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}{labels} missing from {learner.url}/metrics for 30 s")
        time.sleep(0.05)
    return value


def _percentile(values: list[float], q: float) -> Spread:
    """The ``q`` percentile of ``values``, its range a bootstrap 95% interval."""
    data = np.asarray(values)
    rng = np.random.default_rng(0)
    boot = [np.percentile(rng.choice(data, data.size), q) for _ in range(1000)]
    point = float(np.percentile(data, q))
    return Spread(
        point,
        float(np.percentile(boot, 2.5)),
        float(np.percentile(boot, 97.5)),
        int(data.size),
        "s",
    )


BENCHMARK = Benchmark(
    name="freshness",
    summary="publish of a sample -> a replica serving weights trained on it",
    columns=(
        "p50 s",
        "p99 s",
    ),
    run=run,
    sizes=Sizes(
        quick={"probes": 6},
        full={"probes": 200},
    ),
)
