"""The metric families of storage health and the write-ahead log (``base.metrics``: a part
claims its group)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..base.metrics import STEP_BUCKETS, MetricGroup


class StorageMetrics(MetricGroup):
    """Storage health: failed operations, and whether one keeps failing."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.storage_errors = Counter(
            "livefit_storage_errors_total",
            "Failed storage operations (wal_open, wal_write, wal_fsync, checkpoint, "
            "version_mark); nothing that depended on them was acknowledged",
            ["op"],
            registry=registry,
        )
        self.storage_healthy = Gauge(
            "livefit_storage_healthy",
            "0 while a storage operation keeps failing",
            registry=registry,
        )
        self.storage_healthy.set(1)


class WalMetrics(MetricGroup):
    """The write-ahead log: group commits, and what a start replayed or skipped."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.wal_commit_seconds = Histogram(
            "livefit_wal_commit_seconds", "Time to write and fsync one group of accepted messages",
            buckets=STEP_BUCKETS, registry=registry,
        )  # fmt: skip
        self.wal_replayed_samples = Counter(
            "livefit_wal_replayed_samples_total",
            "Samples replayed from the write-ahead log at start (accepted before a crash)",
            ["model"],
            registry=registry,
        )
        self.wal_corrupt_records = Counter(
            "livefit_wal_corrupt_records_total",
            "Records of the write-ahead log skipped at start because they failed their checksum "
            "with intact records after them (their samples were not replayed; each is logged "
            "with its segment and byte offset)",
            registry=registry,
        )
        self.wal_lost_positions = Counter(
            "livefit_wal_lost_positions_total",
            "Write-ahead-log positions a model's restore needed that the log no longer held "
            "(truncated behind checkpoints found damaged or gone at start): the acknowledged "
            "samples of the model among them are lost (logged as an error naming the gap)",
            ["model"],
            registry=registry,
        )
