"""Every metric group livefit declares, for the tests that need every family some livefit
process exports (README, dashboard, Grafana): the ``MetricGroup`` subclasses of each server
package's ``metrics`` module, found rather than listed, so a new group cannot be missed."""

from __future__ import annotations

import importlib
import pkgutil

import livefit.server
from livefit.server.base.metrics import MetricGroup, Metrics


def every_group() -> list[type[MetricGroup]]:
    for package in pkgutil.iter_modules(livefit.server.__path__):
        if package.ispkg and importlib.util.find_spec(f"livefit.server.{package.name}.metrics"):
            importlib.import_module(f"livefit.server.{package.name}.metrics")
    found, todo = [], list(MetricGroup.__subclasses__())
    while todo:
        group = todo.pop()
        found.append(group)
        todo += group.__subclasses__()
    return sorted(found, key=lambda group: f"{group.__module__}.{group.__qualname__}")


def every_family() -> Metrics:
    """A ``Metrics`` on a registry of its own with every group claimed."""
    metrics = Metrics()
    for group in every_group():
        metrics.group(group)
    return metrics
