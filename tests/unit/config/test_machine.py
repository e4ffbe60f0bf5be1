"""The split learner's default size (``http.workers`` unset) and reading one figure from a
group's ``/metrics``: what ``livefit serve`` starts by default, and what a script reads from it.

The reader is checked against a real merged exposition (``merge_expositions`` of real
registries, as a group's ``/metrics`` answers it) served by a real HTTP server on loopback.
"""

from __future__ import annotations

import http.server
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from livefit.clients.metrics import MetricsReader
from livefit.server.base.metrics_merge import merge_expositions
from livefit.server.config.machine import (
    default_serving_processes,
    serving_cpus,
    training_cpus,
    usable_cores,
)
from livefit.server.config.sections import HttpSettings, ProcessSettings
from livefit.server.runtime.learner_group import pin_serving_process


@pytest.mark.parametrize(("cores", "serving"), [(1, 1), (2, 1), (3, 2), (5, 4), (64, 4)])
def test_one_serving_process_per_core_beside_training_within_bounds(
    cores: int, serving: int
) -> None:
    assert default_serving_processes(cores) == serving


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [("max 100000\n", None), ("150000 100000\n", 2), ("50000 100000\n", 1),
     ("100000 100000\n", 1), ("garbage", None), ("-1 100000", None), ("", None)],
)  # fmt: skip
def test_a_cgroup_cpu_quota_caps_the_usable_cores(
    tmp_path: Path, cpu_max: str, expected: int | None
) -> None:
    path = tmp_path / "cpu.max"
    path.write_text(cpu_max)
    unlimited = usable_cores(tmp_path / "absent")
    assert unlimited >= 1
    assert usable_cores(path) == (unlimited if expected is None else min(unlimited, expected))


@pytest.mark.parametrize(
    ("cpus", "setting", "serving", "expected"),
    [([0, 1], "auto", 1, [1]), ([0, 1, 2, 3, 4, 5, 6, 7], "auto", 4, [4, 5, 6, 7]),
     ([0, 1, 2, 3], "auto", 3, [3]), ([0, 1], "auto", 4, [1]), ([0], "auto", 1, None),
     ([2, 5, 9], "auto", 1, [5, 9]), ([0, 1], 0, 1, None), ([0, 1, 2, 3], 2, 1, [2, 3]),
     ([0, 1], 2, 1, None), ([0, 1], 64, 1, None)],
)  # fmt: skip
def test_training_runs_on_the_cores_the_serving_processes_leave(
    tmp_path: Path, cpus: list[int], setting: str | int, serving: int, expected: list[int] | None
) -> None:
    """Issue #29: "auto" leaves one core per serving process (training keeps at least one);
    0, or a count reaching every CPU, pins nothing; the highest-numbered CPUs are taken."""
    absent = tmp_path / "absent"  # no cgroup quota
    assert training_cpus(setting, serving, cpus, absent) == expected


def test_a_cgroup_cpu_quota_counts_in_the_training_cores(tmp_path: Path) -> None:
    quota = tmp_path / "cpu.max"
    quota.write_text("300000 100000\n")  # 3 CPUs' time on an 8-CPU mask
    assert training_cpus("auto", 1, list(range(8)), quota) == [6, 7]
    assert training_cpus(5, 1, list(range(8)), quota) == [5, 6, 7]


def test_training_cores_is_auto_by_default_and_refuses_what_it_cannot_mean() -> None:
    assert ProcessSettings().training_cores == "auto"
    assert ProcessSettings(training_cores=3).training_cores == 3
    for bad in (-1, 5000, "all"):
        with pytest.raises(ValueError, match="training_cores"):
            ProcessSettings(training_cores=bad)


@pytest.mark.parametrize(
    ("cpus", "serving_setting", "training_setting", "expected"),
    [([0, 1], "others", "auto", [0]), ([0, 1], "all", "auto", None),
     ([0, 1, 2, 3, 4, 5, 6, 7], "others", "auto", [0, 1, 2, 3]),
     ([0, 1], "others", 0, None), ([0], "others", "auto", None),
     ([2, 5, 9], "others", "auto", [2])],
)  # fmt: skip
def test_serving_runs_on_every_core_or_on_those_training_leaves(
    tmp_path: Path, cpus: list[int], serving_setting: str, training_setting: str | int,
    expected: list[int] | None,
) -> None:  # fmt: skip
    """``processes.serving_cores``: "all" pins nothing; "others" takes the CPUs the training
    process does not run on, and pins nothing when training is not pinned."""
    serving = 4 if len(cpus) == 8 else 1
    absent = tmp_path / "absent"
    assert serving_cpus(serving_setting, training_setting, serving, cpus, absent) == expected
    if expected is not None:  # the two sets split the mask between them
        training = training_cpus(training_setting, serving, cpus, absent) or []
        assert sorted(expected + training) == sorted(cpus)


def test_a_serving_process_is_pinned_before_its_threads_start() -> None:
    """``pin_serving_process`` narrows the thread that calls it (Linux keeps the mask per
    thread; the serving process calls it from its main thread before any other starts) and a
    thread it starts inherits the mask. Run in a thread of its own, so that this test's process
    keeps its CPUs."""
    every = sorted(os.sched_getaffinity(0))
    settings = ProcessSettings(serving_cores="others")
    seen: dict[str, object] = {}

    def serving_main() -> None:
        seen["pinned"] = pin_serving_process(settings, 1)
        seen["own"] = sorted(os.sched_getaffinity(0))
        child = threading.Thread(target=lambda: seen.update(child=sorted(os.sched_getaffinity(0))))
        child.start()
        child.join()

    main = threading.Thread(target=serving_main)
    main.start()
    main.join()
    expected = serving_cpus("others", "auto", 1, every)
    assert seen["pinned"] == expected
    assert seen["own"] == seen["child"] == (every if expected is None else expected)
    assert sorted(os.sched_getaffinity(0)) == every
    default = ProcessSettings()
    assert default.serving_cores == "all"
    assert pin_serving_process(default, 1) is None


def test_unset_workers_splits_the_learner_and_zero_keeps_one_process() -> None:
    assert HttpSettings().learner_workers() == default_serving_processes() >= 1
    assert HttpSettings(workers=0).learner_workers() == 0
    assert HttpSettings(workers=3).learner_workers() == 3
    assert HttpSettings().replica_workers() == HttpSettings(workers=0).replica_workers() == 1


def _process(trained: float | None, version: float | None, requests: float | None) -> bytes:
    """One process's exposition: the families it owns, as livefit's processes export them."""
    registry = CollectorRegistry()
    if trained is not None:
        Counter("livefit_train_samples", "", ["model"], registry=registry).labels("m").inc(trained)
    if version is not None:
        Gauge("livefit_serving_version", "", ["model"], registry=registry).labels("m").set(version)
    if requests is not None:
        counter = Counter("livefit_predict_requests", "", ["model"], registry=registry)
        counter.labels("m").inc(requests)
    return generate_latest(registry)


@pytest.fixture
def serve_text() -> Iterator[Callable[[bytes], str]]:
    """A loopback HTTP server answering ``/metrics`` with the text last given; yields a setter
    that takes the text and returns the server's base URL."""
    body = [b""]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == "/metrics"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body[0] if found else b'{"error":"Not Found"}')

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def set_text(text: bytes) -> str:
        body[0] = text
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield set_text
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_the_reader_reads_one_figure_from_a_group_or_a_lone_process(
    serve_text: Callable[[bytes], str],
) -> None:
    group = merge_expositions([
        ("training", _process(trained=700, version=None, requests=None)),
        ("0", _process(trained=None, version=5, requests=30)),
        ("1", _process(trained=None, version=4, requests=12)),
    ])  # fmt: skip
    reader = MetricsReader(serve_text(group))
    assert reader.value("livefit_train_samples_total", model="m") == 700  # training's
    assert reader.value("livefit_predict_requests_total", model="m") == 42  # summed
    assert reader.value("livefit_serving_version", model="m") == 4  # what every one serves
    assert reader.value("livefit_serving_version", model="m", worker="0") == 5  # exact labels
    assert reader.value("livefit_serving_version", model="other") == 0.0
    assert reader.value("livefit_absent_total", model="m") == 0.0
    lone = MetricsReader(serve_text(_process(trained=9, version=3, requests=2)))
    assert lone.value("livefit_train_samples_total", model="m") == 9
    assert lone.value("livefit_serving_version", model="m") == 3
    assert lone.samples()[("livefit_predict_requests_total", (("model", "m"),))] == 2


def test_the_reader_takes_the_metrics_address_and_refuses_an_error_page(
    serve_text: Callable[[bytes], str],
) -> None:
    base = serve_text(_process(trained=9, version=None, requests=None))
    assert MetricsReader(base + "/metrics/").value("livefit_train_samples_total", model="m") == 9
    with pytest.raises(httpx.HTTPStatusError):  # livefit's 404 JSON is not metrics text
        MetricsReader(base + "/v1").value("livefit_train_samples_total", model="m")


def test_the_training_process_takes_one_inter_op_thread_unless_told(tmp_path: Path) -> None:
    """A split learner's training process that trains one model on the CPU serves nothing: its
    inter-op pool is one thread (the pipelined trainer measured faster so), its intra-op pool
    its cores; a configured size stays; with two models (whose steps would share the thread)
    or a GPU named, TensorFlow's default stays."""
    from livefit.server.config.settings import Settings
    from livefit.server.runtime.learner_group import TrainingSlot
    from livefit.server.runtime.training_process import (
        TRAINING_INTER_OP_THREADS,
        cpus_for_training,
        size_training_pools,
    )

    models = {"m": {"input_shape": [2], "output_shape": [1]}}
    slot = TrainingSlot(tmp_path, workers=1)
    settings = Settings.model_validate({"models": models})
    size_training_pools(settings, slot)
    assert settings.tensorflow.inter_op_threads == TRAINING_INTER_OP_THREADS == 1
    cpus = cpus_for_training(settings, slot)
    assert settings.tensorflow.intra_op_threads == (0 if cpus is None else len(cpus))
    told = Settings.model_validate(
        {"models": models, "tensorflow": {"inter_op_threads": 3, "intra_op_threads": 5}}
    )
    size_training_pools(told, slot)
    assert (told.tensorflow.inter_op_threads, told.tensorflow.intra_op_threads) == (3, 5)
    two = Settings.model_validate({"models": {**models, "n": models["m"]}})
    size_training_pools(two, slot)
    assert two.tensorflow.inter_op_threads == 0
    gpu = Settings.model_validate({"models": {"m": {**models["m"], "device": "/GPU:0"}}})
    size_training_pools(gpu, slot)
    assert gpu.tensorflow.inter_op_threads == 0
