"""The two layouts of the learner the end-to-end tests run against, and reading either one.

"one process" is the default; "split" is ``http.workers = 1``: a training process and a
serving process under a ``livefit serve`` parent. A test file takes a ``layout`` fixture that
returns "one process"; its split twin (``test_*_split.py``, a file of its own so that xdist's
``--dist loadfile`` runs it on another worker) imports the tests whose subject depends on the
layout and overrides the fixture to return "split".

A split learner's ``/metrics`` merges its processes' series under a ``worker`` label: the
training figures carry ``worker="training"``; ``metric`` finds either.
"""

from __future__ import annotations

from pathlib import Path

from livefit.server.processes.local_processes import LivefitProcess

ONE_PROCESS, SPLIT = "one process", "split"
LAYOUTS = (ONE_PROCESS, SPLIT)
TRAINING_ENV = b"LIVEFIT_TRAINING_DIR="


def with_layout(config: str, layout: str) -> str:
    """``config`` (a whole learner config's TOML) for ``layout``: split adds ``workers = 1`` to
    its ``[http]`` table (a new one when it has none)."""
    if layout == ONE_PROCESS:
        return config
    assert layout == SPLIT, layout
    if "[http]\n" in config:
        return config.replace("[http]\n", "[http]\nworkers = 1\n", 1)
    return "[http]\nworkers = 1\n" + config


def metric(server: LivefitProcess, name: str, **labels: str) -> float:
    """A learner's sample: the one with exactly ``labels``, or a split learner's training
    process's (``worker="training"``); 0.0 when neither exists yet."""
    samples = server.metrics()
    for found in (labels, {**labels, "worker": "training"}):
        value = samples.get((name, tuple(sorted(found.items()))))
        if value is not None:
            return value
    return 0.0


def learner_pid(server: LivefitProcess) -> int:
    """The process holding the MQTT session: the learner, or a split learner's training one."""
    assert server.process is not None
    for task in Path(f"/proc/{server.process.pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            environ = Path(f"/proc/{child}/environ").read_bytes()
            if TRAINING_ENV in environ:
                return int(child)
    return server.process.pid
