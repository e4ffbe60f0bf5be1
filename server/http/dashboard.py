"""The live dashboard: ``GET /`` (one self-contained HTML page) and ``GET /api/stats`` (its data).

The page loads nothing from anywhere (inline CSS and JS, charts on plain ``<canvas>``, a
Content-Security-Policy that blocks every other origin) so it works offline. It polls
``api/stats`` every second and computes rates (samples/s, predictions/s) from successive polls.
``api/stats`` reads this process's Prometheus registry directly: every value is a number or
``null`` (a series that does not exist yet, or a NaN), never an error; its ``problems`` are
readiness's (a broker unreachable or refusing, no weights yet...), shown in the status line.

This module owns the routes and the headers they send; the numbers come from
``dashboard_stats`` and the page from ``dashboard_page``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse
from prometheus_client.parser import text_string_to_metric_families

from ..base.metrics import Metrics
from .dashboard_page import render_page
from .dashboard_stats import collect_stats

# The page's own inline script and style only; fetches to this origin; no other source at all.
CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'"
)
NO_STORE = {"Cache-Control": "no-store"}


def build_dashboard_router(
    metrics: Metrics,
    models: Callable[[], list[str]],
    role: str,
    problems: Callable[[], list[str]] = list,
    group: Callable[[], Awaitable[bytes]] | None = None,
) -> APIRouter:
    """``GET /`` (the page, titled after ``role``) and ``GET /api/stats`` for ``models()``;
    ``problems()``: why the process is not ready (readiness's list), shown on the page. In a
    group of processes, ``group()`` is the merged exposition the stats are read from (counters
    summed over processes; a split learner's training figures from its training process)."""
    router = APIRouter()
    page = render_page(role)

    @router.get("/", include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        """The dashboard page."""
        return HTMLResponse(page, headers={"Content-Security-Policy": CSP, **NO_STORE})

    @router.get("/api/stats")
    async def stats() -> JSONResponse:
        """Counters and gauges per model, as the dashboard polls them."""
        if group is not None:
            merged = (await group()).decode("utf-8")
            body = collect_stats(text_string_to_metric_families(merged), models(), role)
        else:
            body = collect_stats(metrics.registry.collect(), models(), role)
        body["problems"] = problems()
        return JSONResponse(body, headers=NO_STORE)

    return router
