"""What this machine gives livefit's processes: the CPUs they may use, and from that how many
serving processes ``livefit serve`` starts when ``http.workers`` is unset.

Decision (issue #18): an unset ``http.workers`` splits the learner into a training process and
``default_serving_processes()`` serving processes: one core is left to training, each other
usable core gets a serving process, at most ``MAX_DEFAULT_SERVING``. The cap is there because
each serving process is a TensorFlow process of its own (BENCHMARKS.md, "Memory"); a machine
that wants more sets ``http.workers``. On 2 cores that is 1, which serves and trains better than
one process (BENCHMARKS.md, "Serving workers"; the figures: docs/benchmarks/defaults.md).
Imports nothing of TensorFlow: the supervising parent calls it.

Decision (issue #29): the training process of a split learner runs on ``training_cpus()``: by
default the usable cores less one per serving process, at least 1 (on 2 cores: 1 core), and
the highest-numbered of them; the serving processes keep every core. Training then never holds
more cores than the serving processes leave it, so queued predictions find a free core, while
an idle server still trains on its own cores at full speed (BENCHMARKS.md "interference").
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

MAX_DEFAULT_SERVING = 4
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" or "max <period>"


def usable_cores(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """The CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota
    (a container's ``--cpus``) rounded up; at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota(cpu_max)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def default_serving_processes(cores: int | None = None) -> int:
    """Serving processes of a learner whose ``http.workers`` is unset: ``cores - 1`` (one core
    for training), at least 1, at most ``MAX_DEFAULT_SERVING``."""
    cores = usable_cores() if cores is None else cores
    return max(1, min(MAX_DEFAULT_SERVING, cores - 1))


def training_cpus(
    setting: str | int, serving_processes: int, cpus: Sequence[int] | None = None,
    cpu_max: Path = CGROUP_CPU_MAX,
) -> list[int] | None:  # fmt: skip
    """The CPUs a split learner's training process runs on, for ``processes.training_cores``
    (``setting``) beside ``serving_processes`` serving processes; None: every CPU (``0``, or
    nothing to leave out). ``cpus``: the CPUs this process may run on (its affinity mask by
    default). "auto" is ``usable_cores() - serving_processes``, at least 1; a number is capped
    at the usable cores. The highest-numbered CPUs of the mask are taken."""
    if cpus is None:
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not Linux: no affinity to set
            return None
    quota = _cgroup_quota(cpu_max)
    usable = len(cpus) if quota is None else max(1, min(len(cpus), math.ceil(quota)))
    auto = setting == "auto"
    count = max(1, usable - serving_processes) if auto else min(int(setting), usable)
    if count <= 0 or count >= len(cpus):
        return None
    return sorted(cpus)[-count:]


def serving_cpus(
    serving_setting: str, training_setting: str | int, serving_processes: int,
    cpus: Sequence[int] | None = None, cpu_max: Path = CGROUP_CPU_MAX,
) -> list[int] | None:  # fmt: skip
    """The CPUs a split learner's serving processes run on, for ``processes.serving_cores``
    (``serving_setting``); None: every CPU. "others": the CPUs of the mask that
    ``training_cpus`` leaves out (None when training is not pinned); "all": None."""
    if serving_setting != "others":
        return None
    if cpus is None:
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return None
    training = training_cpus(training_setting, serving_processes, cpus, cpu_max)
    if training is None:
        return None
    rest = [cpu for cpu in sorted(cpus) if cpu not in set(training)]
    return rest or None


def _cgroup_quota(cpu_max: Path) -> float | None:
    """The CPU quota in cores, or None (no cgroup v2 file, no quota, or a line not understood)."""
    try:
        fields = cpu_max.read_text().split()
    except OSError:
        return None
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None
