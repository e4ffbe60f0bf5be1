"""One ``/metrics`` for a group of processes: each one's registry, labelled ``worker="<index>"``
(``worker="training"`` for a split learner's training process), merged into one Prometheus
text exposition.

Decision: no prometheus-client multiprocess mode. It needs every metric created in a
multiprocess-aware way and a shared directory of mmap files, drops callback gauges
(``set_function``, which livefit uses for ages, queue depths and GPU memory) and the process
collector, and sums gauges by a per-metric policy. Instead each worker answers its own text on
a Unix socket in a private directory, and whichever worker gets the scrape asks its peers and
merges the families. Every series keeps its own value under its worker's label, so counters
are summed in PromQL (``sum without (worker) (...)``) and per-process gauges (RSS, CPU) stay
per process. A peer that does not answer within ``PEER_TIMEOUT_S`` (restarting) is left out
of that scrape and counted in ``livefit_workers_unreachable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socketserver
import threading
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

log = logging.getLogger(__name__)
PEER_TIMEOUT_S = 2.0
WORKERS_UNREACHABLE = "livefit_workers_unreachable"
MAX_PEER_BYTES = 64 << 20


def merge_expositions(parts: Iterable[tuple[str, bytes]]) -> bytes:
    """``parts`` as (worker label, exposition text) merged into one exposition: one family per
    metric name (its help and type from the first part that has it), every sample labelled
    with its worker."""
    families: dict[str, Metric] = {}
    for worker, text in parts:
        for family in text_string_to_metric_families(text.decode("utf-8")):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            merged.samples.extend(
                Sample(s.name, {**s.labels, "worker": worker}, s.value, s.timestamp, s.exemplar)
                for s in family.samples
            )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)


class _Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


class WorkerMetrics:
    """The metrics side of one process of a group, labelled ``label``: answers its registry's
    text on ``<directory>/<label>.sock`` and builds the merged exposition of itself and
    ``peers`` (the other processes' labels: serving workers ``"0"``, ``"1"``...; a split
    learner's training process ``"training"``)."""

    def __init__(
        self, registry: CollectorRegistry, label: str, peers: Iterable[str], directory: Path
    ) -> None:
        self.registry = registry
        self.label = label
        self.peers = [peer for peer in peers if peer != label]
        self.directory = directory
        self._server: socketserver.UnixStreamServer | None = None

    def path(self, label: str) -> Path:
        return self.directory / f"{label}.sock"

    def start(self) -> None:
        """Answer peers from a daemon thread (the socket replaces one a dead process left)."""
        registry = self.registry

        class Answer(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                try:
                    self.request.sendall(generate_latest(registry))
                except OSError as exc:  # the asking process gave up (this one was stopped)
                    log.debug("metrics peer went away before the answer: %s", exc)

        path = self.path(self.label)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._server = socketserver.ThreadingUnixStreamServer(str(path), Answer)
        os.chmod(path, 0o600)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, name="livefit-worker-metrics", daemon=True
        ).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            with contextlib.suppress(FileNotFoundError):
                self.path(self.label).unlink()

    async def exposition(self) -> bytes:
        """Every process's metrics, merged; peers that do not answer in time are left out."""
        answers = await asyncio.gather(*(self._ask(peer) for peer in self.peers))
        parts = [(self.label, generate_latest(self.registry))]
        parts += [(peer, text) for peer, text in zip(self.peers, answers, strict=True) if text]
        missing = sum(1 for text in answers if not text)
        parts.append((self.label, _unreachable(missing)))
        return merge_expositions(parts)

    async def _ask(self, label: str) -> bytes | None:
        try:
            async with asyncio.timeout(PEER_TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(str(self.path(label)))
                chunks, size = [], 0
                try:
                    while size <= MAX_PEER_BYTES and (chunk := await reader.read(1 << 16)):
                        chunks.append(chunk)
                        size += len(chunk)
                finally:
                    writer.close()
                return b"".join(chunks) if size <= MAX_PEER_BYTES else None
        except (OSError, TimeoutError) as exc:
            log.debug("process %s did not answer for /metrics: %s", label, exc)
            return None


def _unreachable(count: int) -> bytes:
    return (
        f"# HELP {WORKERS_UNREACHABLE} Processes of the group left out of this scrape (no "
        "answer in time: restarting or stopped)\n"
        f"# TYPE {WORKERS_UNREACHABLE} gauge\n"
        f"{WORKERS_UNREACHABLE} {count}\n"
    ).encode()
