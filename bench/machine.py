"""Facts about the machine and the checkout that change what the figures mean."""

from __future__ import annotations

import datetime as dt
import os
import platform
from pathlib import Path
from typing import Any

from bench.harness import REPO


def machine_facts() -> dict[str, Any]:
    """Facts that change what the figures mean: cores, CPU, memory, versions, device."""
    import numpy as np

    facts: dict[str, Any] = {
        "cores_logical": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "recorded_at": now_iso(),
    }
    facts.update(_framework_facts())
    facts["livefit"] = _livefit_version()
    facts["commit"] = _commit()
    return facts


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


def _framework_facts() -> dict[str, Any]:
    import keras
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    device = "CPU"
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        device = f"GPU: {details.get('device_name', gpus[0].name)} (x{len(gpus)})"
    return {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "device": device,
        "tf_intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "tf_inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        import psutil

        return round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        return None


def _livefit_version() -> str:
    try:
        from livefit import __version__

        return str(__version__)
    except ImportError:
        return "unknown"


def _commit() -> str | None:
    """The checked-out commit, read from .git without running git (None when not a checkout).

    In a worktree ``.git`` is a file naming the worktree's git dir (which holds ``HEAD``), and
    branches live in the common dir it names in ``commondir``."""
    git = REPO / ".git"
    try:
        if git.is_file():  # "gitdir: <path>"
            git = Path(git.read_text().strip().removeprefix("gitdir: "))
        common = git
        if (git / "commondir").exists():
            common = (git / (git / "commondir").read_text().strip()).resolve()
        ref = (git / "HEAD").read_text().strip()
        if not ref.startswith("ref: "):
            return ref[:12]
        target = common / ref[5:]
        if target.exists():
            return target.read_text().strip()[:12]
        for line in (common / "packed-refs").read_text().splitlines():
            if line.endswith(ref[5:]):
                return line.split()[0][:12]
    except OSError:
        return None
    return None
