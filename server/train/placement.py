"""Where a trainer's model lives: one device, or several mirrored by ``MirroredStrategy``.

On several devices every variable (weights, optimizer state, the step's rollback copy, the
scaling statistics) has one copy per device, kept equal: each step's batch is padded with
zero-weight rows to a multiple of the device count (``pad_rows``), each device takes one
contiguous slice of it, and the summed gradients update every copy alike. The padding keeps
the traced shapes bounded as the ``None`` batch dimension already does; the loss divides by
the real row count, so a padded row adds nothing to it or to the gradients. Reading a
variable (snapshots, checkpoints) reads one copy: the tensors, their names, dtypes and shapes
are those of a one-device model, so either restores the other's checkpoints.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import tensorflow as tf


class Placement:
    """One device (``strategy`` None, exactly the one-device code path) or several."""

    def __init__(self, devices: Sequence[str]) -> None:
        if not devices:
            raise ValueError("a placement needs at least one device")
        self.devices = tuple(devices)
        self.strategy = mirrored_strategy(self.devices) if len(self.devices) > 1 else None

    @property
    def primary(self) -> str:
        """The first device: where one-device work (and a single-device model) runs."""
        return self.devices[0]

    @property
    def replicas(self) -> int:
        return len(self.devices)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Create variables here: mirrored on every device, or on the one device."""
        if self.strategy is None:
            with tf.device(self.primary):
                yield
        else:
            with self.strategy.scope():
                yield

    def __repr__(self) -> str:
        return f"Placement({', '.join(self.devices)})"


_strategies: dict[tuple[str, ...], tf.distribute.MirroredStrategy] = {}
_strategies_lock = threading.Lock()


def mirrored_strategy(devices: tuple[str, ...]) -> tf.distribute.MirroredStrategy:
    """The process's one strategy over ``devices``: every trainer on them shares it, because
    two strategies over the same devices number their collective operations alike and one's
    all-reduce then meets the other's (TensorFlow aborts the step: "Shape mismatch in the
    collective instance")."""
    with _strategies_lock:
        strategy = _strategies.get(devices)
        if strategy is None:
            strategy = _strategies[devices] = tf.distribute.MirroredStrategy(list(devices))
        return strategy


def as_placement(device: str | Placement) -> Placement:
    """``device`` as a placement (a device name is a one-device placement)."""
    return device if isinstance(device, Placement) else Placement([device])


def pad_rows(
    x: np.ndarray, y: np.ndarray, w: np.ndarray, multiple: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``x``, ``y``, ``w`` with zero rows appended up to a multiple of ``multiple`` rows; the
    added rows weigh 0 (the arrays themselves when no row is missing)."""
    missing = -len(x) % multiple
    if missing == 0:
        return x, y, w
    return (
        np.concatenate([x, np.zeros((missing, *x.shape[1:]), dtype=x.dtype)]),
        np.concatenate([y, np.zeros((missing, *y.shape[1:]), dtype=y.dtype)]),
        np.concatenate([w, np.zeros(missing, dtype=w.dtype)]),
    )


def replica_slice(rows: tf.Tensor, replicas: int) -> tf.Tensor:
    """The contiguous slice of ``rows`` (padded to a multiple of ``replicas``) that the
    calling replica trains on: replica i takes rows ``i*k .. (i+1)*k - 1``."""
    context = tf.distribute.get_replica_context()
    part = tf.shape(rows)[0] // replicas
    start = context.replica_id_in_sync_group * part
    return rows[start : start + part]
