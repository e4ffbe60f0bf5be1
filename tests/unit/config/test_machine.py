"""What the machine gives (``config.machine``): the split learner's default size
(``http.workers`` unset), the cores its serving and training processes take, a cgroup CPU
quota counted in."""

from __future__ import annotations

from pathlib import Path

import pytest

from livefit.server.config.machine import (
    default_serving_processes,
    serving_cpus,
    training_cpus,
    usable_cores,
)
from livefit.server.config.sections import HttpSettings, ProcessSettings


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


def test_unset_workers_splits_the_learner_and_zero_keeps_one_process() -> None:
    assert HttpSettings().learner_workers() == default_serving_processes() >= 1
    assert HttpSettings(workers=0).learner_workers() == 0
    assert HttpSettings(workers=3).learner_workers() == 3
    assert HttpSettings().replica_workers() == HttpSettings(workers=0).replica_workers() == 1
