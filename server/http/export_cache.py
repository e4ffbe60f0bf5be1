"""Exports of kept snapshots (``GET /v1/models/{name}/export/onnx``), made on request, one at a
time per process, and cached per model, lineage and version (the newest ``keep`` of them)."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from livefit.models.export import export_onnx

from ..weights.format import decode_weights, payload_description
from ..weights.store import EncodedWeights

EXPORTERS: dict[str, Callable[[str, list], bytes]] = {"onnx": export_onnx}


@dataclass(frozen=True, slots=True)
class Export:
    """One exported file and what it cost to make."""

    data: bytes
    seconds: float
    cached: bool


class ExportCache:
    """The exports this process made, newest ``keep``; conversions run one at a time in a
    worker thread, so the event loop keeps serving."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._items: OrderedDict[tuple[str, str, int, str], Export] = OrderedDict()
        self._lock = asyncio.Lock()

    async def get(self, model: str, item: EncodedWeights, fmt: str) -> Export:
        """The ``fmt`` file of ``item``; raises what the exporter raises."""
        key = (model, item.lineage, item.version, fmt)
        async with self._lock:  # one conversion at a time; a second asker finds it cached
            found = self._items.get(key)
            if found is not None:
                return Export(found.data, found.seconds, cached=True)
            started = time.perf_counter()
            data = await asyncio.to_thread(_convert, item.payload, fmt)
            made = Export(data, time.perf_counter() - started, cached=False)
            self._items[key] = made
            while len(self._items) > self.keep:
                self._items.popitem(last=False)
            return made


def _convert(payload: bytes, fmt: str) -> bytes:
    _, arrays, _ = decode_weights(payload)
    return EXPORTERS[fmt](payload_description(payload), arrays)
