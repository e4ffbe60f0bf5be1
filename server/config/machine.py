"""What this machine gives livefit's processes: the CPUs they may use, and from that how many
serving processes ``livefit serve`` starts when ``http.workers`` is unset.

Decision (issue #18): an unset ``http.workers`` splits the learner into a training process and
``default_serving_processes()`` serving processes: one core is left to training, each other
usable core gets a serving process, at most ``MAX_DEFAULT_SERVING``. The cap is there because
each serving process is a TensorFlow process of its own (about 300 MiB PSS, 600 MiB RSS on
the benchmark model, BENCHMARKS.md "memory"); a machine that wants more sets ``http.workers``.
On 2 cores that is 1, measured better than one process at the defaults (BENCHMARKS.md
"workers", "interference"). Imports nothing of TensorFlow: the supervising parent calls it.
"""

from __future__ import annotations

import math
import os
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
