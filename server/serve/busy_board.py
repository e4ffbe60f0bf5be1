"""The "predictions are waiting" signal between processes: a small shared-memory board.

In a split learner (``http.workers >= 1``) the trainer runs in one process and the request
batchers in others, but the trainer must still give way while prediction requests queue (on a
small machine its kernels otherwise take the cores the serving processes need). The board is a
file of ``workers x models`` bytes, mapped by every process of the group: serving worker ``w``
writes 1 in its byte for model ``m`` while its batcher holds queued rows and 0 when it is
empty; the trainer of model ``m`` reads the model's column. One byte per writer means no
locks: each byte has one writer, and a reader seeing a value a moment late costs at most one
training step of give-way. A worker that dies with its byte at 1 has it cleared when it
starts again (``claim``), and the trainer's give-way is bounded in time anyway.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from pathlib import Path

BOARD_FILE = "busy"


class BusyBoard:
    """Worker ``w`` marks model ``m`` busy or idle; anyone reads whether any worker is busy."""

    def __init__(self, path: Path, workers: int, models: Sequence[str], *, create: bool) -> None:
        self.workers = workers
        self.models = list(models)
        self._column = {name: i for i, name in enumerate(self.models)}
        size = max(1, workers * len(self.models))
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def _offset(self, worker: int, model: str) -> int:
        return worker * len(self.models) + self._column[model]

    def claim(self, worker: int) -> None:
        """Clear what a previous process in slot ``worker`` left."""
        for name in self.models:
            self._map[self._offset(worker, name)] = 0

    def set(self, worker: int, model: str, busy: bool) -> None:
        self._map[self._offset(worker, model)] = 1 if busy else 0

    def busy(self, model: str) -> bool:
        """True while any worker has prediction requests for ``model`` queued."""
        column = self._column.get(model)
        if column is None:
            return False
        stride = len(self.models)
        return any(self._map[w * stride + column] for w in range(self.workers))

    def close(self) -> None:
        self._map.close()
