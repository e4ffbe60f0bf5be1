"""Encoded snapshots (``EncodedWeights``) and the last few of one model (``WeightStore``), kept
for ``GET /v1/models/{name}/weights``."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EncodedWeights:
    """One snapshot as it travels: the safetensors bytes and their digest."""

    version: int
    payload: bytes
    sha256: str
    created_at: float
    lineage: str = ""
    # The signed envelope without its body (``format.detached``): what lets a client of
    # ``GET /v1/models/{name}/weights`` verify the payload; b"" until it was signed.
    envelope: bytes = b""


class WeightStore:
    """The last few encoded snapshots of one model, for ``GET /v1/models/{name}/weights``.

    Only one lineage is kept: a snapshot of another lineage replaces everything, so that a
    ``?version=N`` never answers with another history's version N.
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._items: OrderedDict[int, EncodedWeights] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, item: EncodedWeights) -> None:
        with self._lock:
            newest = next(reversed(self._items.values()), None)
            if newest is not None and newest.lineage != item.lineage:
                self._items.clear()
            self._items[item.version] = item  # a version again (now signed) keeps its place
            while len(self._items) > self.keep:
                self._items.popitem(last=False)

    def get(self, version: int | None = None) -> EncodedWeights | None:
        """The given version if still kept, else None; the newest when ``version`` is None."""
        with self._lock:
            if version is None:
                return next(reversed(self._items.values()), None)
            return self._items.get(version)
