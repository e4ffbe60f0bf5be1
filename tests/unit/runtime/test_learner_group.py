"""The learner group's own parts in process (``runtime.learner_group``); the group of real
processes: ``tests/e2e/test_learner_group.py``."""

from __future__ import annotations

import os
import threading

from livefit.server.config.machine import (
    serving_cpus,
)
from livefit.server.config.sections import ProcessSettings
from livefit.server.runtime.learner_group import pin_serving_process


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
