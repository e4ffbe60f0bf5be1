"""The two layouts of the learner the end-to-end tests run against, and reading either one.

"split" is ``http.workers = 1``: a training process and a serving process under a ``livefit
serve`` parent, what ``livefit serve`` runs by default on 2 cores (unset ``http.workers``: one
serving process per core beside training's). "one process" is ``http.workers = 0``. Both are
written into the config explicitly, so a test runs the same layout on any machine.

Most end-to-end tests run the one-process learner (``tests/configs.learner_config``'s
default): it starts one TensorFlow process, not two, which keeps the suite inside CI's time on
2 cores. The tests whose subject depends on the layout run both: their ``layout`` argument is
parametrized with ``LAYOUTS`` (``in_both_layouts``, or a fixture with ``params=LAYOUTS``), ids
``[one-process]`` and ``[split]``; ``tests/conftest.py`` schedules a file's ``[split]`` tests
apart from the rest of it, so the two halves run on different test workers.
``test_learner_group.py``, ``unit/config/test_machine.py`` and the tests that start ``livefit
serve`` from a config of their own (no ``http.workers``) run the default.

A split learner's ``/metrics`` merges its processes' series under a ``worker`` label: the
training figures carry ``worker="training"``; ``metric`` finds either.
"""

from __future__ import annotations

import re
from typing import Literal

import pytest

from livefit.local_servers import LivefitProcess
from tests.procfs import training_process

ONE_PROCESS, SPLIT = "one process", "split"
LAYOUTS = (ONE_PROCESS, SPLIT)
LAYOUT_IDS = ("one-process", "split")  # test ids: ``test_x[split]``


WORKERS = {ONE_PROCESS: 0, SPLIT: 1}


def in_both_layouts(scope: Literal["function", "module"] = "function") -> pytest.MarkDecorator:
    """Runs a test once per layout, its ``layout`` argument each of ``LAYOUTS``;
    ``scope="module"`` where a module fixture takes the layout (one per layout)."""
    return pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS, scope=scope)


def with_layout(config: str, layout: str) -> str:
    """``config`` (a whole learner config's TOML) for ``layout``: its ``http.workers`` set to
    0 (one process) or 1 (split)."""
    return with_workers(config, WORKERS[layout])


def with_workers(config: str, workers: int) -> str:
    """``config`` with ``http.workers = workers``, in its ``[http]`` table (a new one when it
    has none)."""
    line = f"workers = {workers}"
    if re.search(r"(?m)^workers = \d+$", config):
        return re.sub(r"(?m)^workers = \d+$", line, config, count=1)
    if "[http]\n" in config:
        return config.replace("[http]\n", f"[http]\n{line}\n", 1)
    return f"[http]\n{line}\n" + config


def metric(server: LivefitProcess, name: str, **labels: str) -> float:
    """A learner's sample: the one with exactly ``labels``, or a split learner's training
    process's (``worker="training"``); 0.0 when neither exists yet."""
    samples = server.metrics()
    for found in (labels, {**labels, "worker": "training"}):
        value = samples.get((name, tuple(sorted(found.items()))))
        if value is not None:
            return value
    return 0.0


def metric_sum(server: LivefitProcess, name: str) -> float:
    """The sum of every sample of ``name``, whatever its labels (every model, kind, worker)."""
    return sum(value for (sample, _), value in server.metrics().items() if sample == name)


def learner_pid(server: LivefitProcess) -> int:
    """The process holding the MQTT session: the learner, or a split learner's training one."""
    assert server.process is not None
    training = training_process(server.process.pid)
    return server.process.pid if training is None else training
