"""The serving copy of a model: its own weights, swapped only between batches.

A ``ServingModel`` is used by exactly one thread (its batcher's executor, or the event loop for
a model cheap enough to be called there: ``runs_inline``). Before each batch it looks at its
snapshot source; when a newer snapshot is there it loads those weights into its runtime
(``runtimes``: the graph of ``keras``, ``xla``, or a NumPy forward pass), and the whole batch
then runs on that one version, which is returned with the outputs. A compiled runtime is
compiled once per padded batch size (the sizes in ``allowed_batch_sizes``), so the set of
compiled shapes is bounded whatever batch sizes arrive; padding never leaves this class (the
NumPy runtime compiles nothing and is not padded). What the HTTP API reaches by a model's
name, this copy with its batcher, settings and recorder, is ``endpoint.ModelEndpoint``.

A batch for a past version (``predict_version``: the versioned paths) runs on a second runtime
of its own, built on the first such batch: another NumPy runtime over the same layers (its
weights the version's own arrays), or a clone of the network for the graph runtimes (a trace,
once), whose weights are set only when the version asked for changes. So the newest weights'
runtime is never disturbed; a network that cannot be cloned swaps the version's weights in and
the newest back after the batch (two ``set_weights``).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable

import keras
import numpy as np

from ..wire.snapshot import Snapshot
from .runtimes import Runtime, build_runtime, second_runtime

log = logging.getLogger(__name__)

SnapshotSource = Callable[[], Snapshot | None]
# A model call cheaper than this runs on the event loop (``RequestBatcher(inline=True)``). why:
# the hand-over to the model thread and back costs more than a NumPy forward pass of a small
# MLP (BENCHMARKS.md#serving-throughput-and-latency; figures: docs/benchmarks/defaults.md).
INLINE_MAX_CALL_S = 0.5e-3


class NotReady(Exception):
    """No weights yet: the model cannot answer (HTTP 503)."""


class ServingModel:
    """The serving copy of a model: the weights one thread predicts with, not the endpoint.

    Predicts with the newest snapshot from ``source``, padded to ``batch_sizes`` where the
    runtime compiles per shape; ``runtime`` is ``serve.runtime`` (``runtimes.build_runtime``:
    ``model`` is what it computes, and its weights are the runtime's to set)."""

    def __init__(
        self,
        name: str,
        model: keras.Model,
        input_shape: list[int],
        batch_sizes: list[int],
        source: SnapshotSource,
        device: str,
        on_swap: Callable[[Snapshot], None] | None = None,
        runtime: str = "keras",
    ) -> None:
        self.name = name
        self.model = model
        self.input_shape = list(input_shape)
        self.batch_sizes = sorted(batch_sizes)
        self.source = source
        self.device = device
        self.on_swap = on_swap
        self.snapshot: Snapshot | None = None
        self.warm_timings: dict[int, float] = {}  # batch size -> seconds of one call, warm
        self._owner: int | None = None
        self.runtime = build_runtime(runtime, model, input_shape, device, name)
        self._past: Runtime | None = None  # computes past versions (built on first use)
        self._past_snapshot: Snapshot | None = None  # the version ``_past`` holds
        self._past_unavailable = False  # no clone of the network: swap on ``runtime`` instead
        log.debug("model %s serves with the %s runtime", name, self.runtime.name)

    @property
    def version(self) -> int | None:
        return self.snapshot.version if self.snapshot else None

    @property
    def max_batch_size(self) -> int:
        return self.batch_sizes[-1]

    def runs_inline(self) -> bool:
        """True when a full batch, warm, costs less than ``INLINE_MAX_CALL_S`` on a runtime
        that holds the GIL throughout (NumPy): handing such a call to the model thread and its
        answer back to the event loop costs more than the call (known after ``warm_up``)."""
        full = self.warm_timings.get(self.max_batch_size)
        return self.runtime.name == "numpy" and full is not None and full < INLINE_MAX_CALL_S

    def warm_up(self) -> None:
        """Compile and run once per allowed batch size, so no request pays for tracing; then
        time the smallest and largest sizes (the batch cost's starting point)."""
        for size in self.batch_sizes:
            self.runtime(np.zeros((size, *self.input_shape), dtype=np.float32))
        for size in {self.batch_sizes[0], self.batch_sizes[-1]}:
            rows = np.zeros((size, *self.input_shape), dtype=np.float32)
            times = []
            for _ in range(3):
                started = time.perf_counter()
                self.runtime(rows)
                times.append(time.perf_counter() - started)
            self.warm_timings[size] = sorted(times)[1]

    def refresh(self) -> Snapshot | None:
        """Swap to the source's newest snapshot if it is newer than ours (a later version, or
        another lineage); return ours."""
        latest = self.source()
        if latest is not None and latest is not self.snapshot and latest.newer_than(self.snapshot):
            self.runtime.load(latest.weights)
            self.snapshot = latest
            if self.on_swap is not None:
                self.on_swap(latest)
        return self.snapshot

    def predict(self, rows: np.ndarray) -> tuple[np.ndarray, int]:
        """Outputs for ``rows`` (N, *input_shape) and the version that computed all of them."""
        self._check_thread()
        snapshot = self.refresh()
        if snapshot is None:
            raise NotReady(f"model {self.name} has no weights yet")
        return self._run_all(self.runtime, rows), snapshot.version

    def _run_all(self, runtime: Runtime, rows: np.ndarray) -> np.ndarray:
        outputs = [self._run_padded(runtime, part) for part in self._parts(rows)]
        return outputs[0] if len(outputs) == 1 else np.concatenate(outputs)

    def predict_version(self, rows: np.ndarray, snapshot: Snapshot) -> tuple[np.ndarray, int]:
        """Outputs for ``rows`` computed with ``snapshot``'s weights (a kept version), and its
        version; the current version's runtime computes it when ``snapshot`` is current."""
        self._check_thread()
        current = self.refresh()
        if snapshot is current:
            return self._run_all(self.runtime, rows), snapshot.version
        past = self._past_runtime()
        if past is None:  # the current runtime, its weights put back after
            self.runtime.load(snapshot.weights)
            try:
                return self._run_all(self.runtime, rows), snapshot.version
            finally:
                if current is not None:
                    self.runtime.load(current.weights)
        if self._past_snapshot is not snapshot:
            past.load(snapshot.weights)
            self._past_snapshot = snapshot
        return self._run_all(past, rows), snapshot.version

    def _past_runtime(self) -> Runtime | None:
        """The runtime for past versions: built once; None where the network cannot be cloned
        (then past versions are swapped onto the current runtime)."""
        if self._past is not None or self._past_unavailable:
            return self._past
        try:
            self._past = second_runtime(self.runtime, self.model, self.input_shape, self.device)
        except Exception as exc:  # a network Keras cannot clone (a subclassed model)
            log.warning("model %s: past versions swap weights on the serving copy (no clone "
                        "of the network: %s)", self.name, exc)  # fmt: skip
            self._past_unavailable = True
        return self._past

    def padded_size(self, rows: int) -> int:
        """The allowed batch size a call with ``rows`` rows is padded to."""
        return self.batch_sizes[bisect.bisect_left(self.batch_sizes, rows)]

    def _parts(self, rows: np.ndarray) -> list[np.ndarray]:
        step = self.max_batch_size
        return [rows[i : i + step] for i in range(0, rows.shape[0], step)]

    def _run_padded(self, runtime: Runtime, rows: np.ndarray) -> np.ndarray:
        n = rows.shape[0]
        size = self.padded_size(n) if runtime.pads else n
        if size != n:
            padded = np.zeros((size, *rows.shape[1:]), dtype=np.float32)
            padded[:n] = rows
            rows = padded
        return runtime(rows)[:n]

    def _check_thread(self) -> None:
        """Only one thread may use a serving model (its weights change between calls)."""
        ident = threading.get_ident()
        if self._owner is None:
            self._owner = ident
        elif self._owner != ident:
            raise RuntimeError(f"serving model {self.name} used from two threads")
