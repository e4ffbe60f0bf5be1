"""The request batcher with requests pinned to past versions (the versioned paths): a batch
holds one version only, the oldest request decides which, the rest keep their order, and a
pinned batch is computed by ``predict_version`` with that version's snapshot."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from livefit.server.serve.batcher import RequestBatcher
from livefit.server.wire.snapshot import Snapshot

HUGE_MS = 1e9


def snapshot(version: int, lineage: str = "a") -> Snapshot:
    return Snapshot("m", version, (), 0.0, 0, lineage=lineage)


class VersionedModel:
    """Newest: version 100, adds 100; a past version adds its number. Records each call as
    (version, rows); blocks while ``gate`` is closed."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.gate = threading.Event()
        self.gate.set()

    def predict(self, rows: np.ndarray) -> tuple[np.ndarray, int]:
        self.gate.wait(10)
        self.calls.append((100, rows.shape[0]))
        return rows + 100.0, 100

    def predict_version(self, rows: np.ndarray, pinned: Snapshot) -> tuple[np.ndarray, int]:
        self.gate.wait(10)
        self.calls.append((pinned.version, rows.shape[0]))
        return rows + float(pinned.version), pinned.version


def rows(n: int = 1) -> np.ndarray:
    return np.zeros((n, 2), dtype=np.float32)


def test_a_batch_holds_one_version_and_the_others_keep_their_places() -> None:
    async def main() -> None:
        model = VersionedModel()
        batcher = RequestBatcher("m", model.predict, max_batch_size=4, batch_timeout_ms=0,
                                 max_queue_rows=100, predict_version=model.predict_version)  # fmt: skip
        batcher.start()
        try:
            model.gate.clear()  # the first batch holds the model while the rest queue
            first = asyncio.create_task(batcher.submit(rows(), 60))
            await asyncio.sleep(0.05)
            v3, v5 = snapshot(3), snapshot(5)
            order = [v3, None, v5, v3, None, v3]
            tasks = [asyncio.create_task(batcher.submit(rows(), 60, pinned=p)) for p in order]
            await asyncio.sleep(0.05)
            assert batcher.queued_rows == 6
            model.gate.set()
            results = await asyncio.gather(first, *tasks)
        finally:
            await batcher.stop()
        assert model.calls == [(100, 1), (3, 3), (100, 2), (5, 1)]
        answered = [(r.version, float(r.outputs[0, 0])) for r in results]
        assert answered == [(100, 100.0), (3, 3.0), (100, 100.0), (5, 5.0), (3, 3.0),
                            (100, 100.0), (3, 3.0)]  # fmt: skip

    asyncio.run(main())


def test_a_version_batch_keeps_its_order_when_one_request_does_not_fit() -> None:
    """A pinned request too large for the rest of the batch waits, and no later request of its
    version passes it."""

    async def main() -> None:
        model = VersionedModel()
        batcher = RequestBatcher("m", model.predict, max_batch_size=4, batch_timeout_ms=HUGE_MS,
                                 max_queue_rows=100, predict_version=model.predict_version)  # fmt: skip
        batcher.start()
        try:
            v7 = snapshot(7)
            sizes = [3, 2, 1, 1]
            tasks = [asyncio.create_task(batcher.submit(rows(n), 60, pinned=v7)) for n in sizes]
            results = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        finally:
            await batcher.stop()
        assert model.calls == [(7, 3), (7, 4)]
        assert all(r.version == 7 for r in results)
        assert batcher.queued_rows == 0

    asyncio.run(main())


def test_the_same_number_in_another_lineage_is_another_version() -> None:
    async def main() -> None:
        model = VersionedModel()
        batcher = RequestBatcher("m", model.predict, max_batch_size=4, batch_timeout_ms=0,
                                 max_queue_rows=100, predict_version=model.predict_version)  # fmt: skip
        batcher.start()
        try:
            model.gate.clear()
            first = asyncio.create_task(batcher.submit(rows(), 60))
            await asyncio.sleep(0.05)
            pins = [snapshot(3, "a"), snapshot(3, "b"), snapshot(3, "a")]
            tasks = [asyncio.create_task(batcher.submit(rows(), 60, pinned=p)) for p in pins]
            await asyncio.sleep(0.05)
            model.gate.set()
            await asyncio.gather(first, *tasks)
        finally:
            await batcher.stop()
        assert model.calls == [(100, 1), (3, 2), (3, 1)]

    asyncio.run(main())


def test_cancelled_and_late_pinned_requests_leave_the_queue_counted() -> None:
    async def main() -> None:
        model = VersionedModel()
        batcher = RequestBatcher("m", model.predict, max_batch_size=4, batch_timeout_ms=0,
                                 max_queue_rows=100, predict_version=model.predict_version)  # fmt: skip
        batcher.start()
        try:
            model.gate.clear()
            first = asyncio.create_task(batcher.submit(rows(), 60))
            await asyncio.sleep(0.05)
            gone = asyncio.create_task(batcher.submit(rows(2), 60, pinned=snapshot(4)))
            late = asyncio.create_task(batcher.submit(rows(), 0.01, pinned=snapshot(4)))
            kept = asyncio.create_task(batcher.submit(rows(), 60, pinned=snapshot(6)))
            await asyncio.sleep(0.05)
            gone.cancel()
            model.gate.set()
            await first
            assert (await kept).version == 6
        finally:
            await batcher.stop()
        assert late.done() and late.exception() is not None
        assert model.calls == [(100, 1), (6, 1)]
        assert batcher.queued_rows == 0

    asyncio.run(main())
