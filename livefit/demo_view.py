"""What the demo shows: the learner's /metrics and the replica's version read periodically
(``Progress``), a live table or a line every 5 s while it runs (``show_progress``), and the
final summary (``print_summary``), which also says whether the model learned (the prequential
loss fell).
"""

from __future__ import annotations

import time

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.live import Live
from rich.table import Table

from .demo_stop import StopRequest
from .demo_traffic import PredictionLoad, PublisherThread


class Progress:
    """Reads the learner's /metrics and keeps the first and latest readings."""

    def __init__(self, url: str, replica_url: str, model: str) -> None:
        self.url = url
        self.replica_url = replica_url
        self.model = model
        self.replica_version = 0.0
        self.first_loss: float | None = None
        self.latest: dict[str, float] = {}
        self.previous: tuple[float, dict[str, float]] | None = None
        self.first: tuple[float, dict[str, float]] | None = None
        self.rates: dict[str, float] = {}

    def poll(self) -> None:
        """Read the learner's metrics and the replica's version now (kept as they were when
        either cannot be read)."""
        try:
            text = httpx.get(f"{self.url}/metrics", timeout=2).text
            replica = httpx.get(f"{self.replica_url}/v1/models/{self.model}", timeout=2).json()
            self.replica_version = float(replica["model_version_status"][0]["version"])
        except (httpx.HTTPError, KeyError, ValueError, IndexError, TypeError):
            return
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.labels.get("model", self.model) == self.model and not sample.labels.get(
                    "le"
                ):
                    key = sample.name
                    if sample.name == "livefit_predict_requests_total":
                        key = f"{sample.name}:{sample.labels.get('code')}"
                    values[key] = values.get(key, 0.0) + sample.value
        now = time.monotonic()
        if self.previous is not None:
            self.rates = _rates(self.previous, (now, values))
        self.previous = (now, values)
        if self.first is None:
            self.first = (now, values)
        self.latest = values
        loss = self.loss
        if self.first_loss is None and loss is not None and loss > 0:
            self.first_loss = loss

    def whole_run_rates(self) -> dict[str, float]:
        """The rates from the first poll to the latest (the live view's are since the one
        before: a moment, which says little once the stream has ended)."""
        if self.first is None or self.previous is None:
            return {}
        return _rates(self.first, self.previous)

    def get(self, key: str) -> float:
        """The latest reading of ``key`` (a sample name, summed over the model's series)."""
        return self.latest.get(key, 0.0)

    @property
    def loss(self) -> float | None:
        """The prequential loss, or None before anything was trained (the gauge reads 0)."""
        value = self.latest.get("livefit_prequential_loss")
        if value is None or value != value or self.get("livefit_train_samples_total") <= 0:
            return None
        return value

    def ratio(self, numerator: str, denominator: str) -> float:
        """``numerator`` / ``denominator`` of the latest readings (a mean from a sum and count)."""
        return self.get(numerator) / max(self.get(denominator), 1.0)


RATE_KEYS = (
    "livefit_train_samples_total", "livefit_predict_batch_size_count",
    "livefit_predict_requests_total:200",
)  # fmt: skip


def _rates(
    start: tuple[float, dict[str, float]], end: tuple[float, dict[str, float]]
) -> dict[str, float]:
    """Per second of ``RATE_KEYS`` between two polls, each (monotonic time, values)."""
    (then, before), (now, after) = start, end
    return {k: (after.get(k, 0) - before.get(k, 0)) / max(now - then, 1e-6) for k in RATE_KEYS}


def _loss_text(loss: float | None, digits: int = 5) -> str:
    return "-" if loss is None else f"{loss:.{digits}f}"


def _table(
    progress: Progress, predictor: PredictionLoad, title: str, rates: dict[str, float] | None = None
) -> Table:
    """The demo's figures; ``rates`` replaces the live rates (the summary's whole-run ones)."""
    table = Table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    p = progress
    rates = p.rates if rates is None else rates
    table.add_row("samples trained", f"{p.get('livefit_train_samples_total'):,.0f}")
    table.add_row("training samples/s", f"{rates.get('livefit_train_samples_total', 0):,.0f}")
    table.add_row(
        "mean train batch",
        f"{p.ratio('livefit_train_batch_size_sum', 'livefit_train_batch_size_count'):.1f}",
    )
    table.add_row("prequential loss", _loss_text(p.loss))
    table.add_row("model version", f"{p.get('livefit_model_version'):,.0f}")
    table.add_row("serving version (learner)", f"{p.get('livefit_serving_version'):,.0f}")
    table.add_row("replica version", f"{p.replica_version:,.0f}")
    table.add_row("predictions/s", f"{rates.get('livefit_predict_requests_total:200', 0):,.0f}")
    table.add_row(
        "mean predict batch",
        f"{p.ratio('livefit_predict_batch_size_sum', 'livefit_predict_batch_size_count'):.1f}",
    )
    latencies = predictor.latencies[-2000:]
    if latencies:
        p50, p99 = np.percentile(latencies, [50, 99]) * 1000
        table.add_row("predict latency p50 / p99", f"{p50:.1f} / {p99:.1f} ms")
    return table


def show_progress(
    console: Console, progress: Progress, predictor: PredictionLoad, duration: float,
    stop: StopRequest, live: bool,
) -> None:  # fmt: skip
    """Poll ``progress`` and show it for ``duration`` seconds or until ``stop``: a live table
    when ``live`` and the console is a terminal, else a line every 5 s."""
    started = time.monotonic()
    if live and console.is_terminal:
        with Live(console=console, refresh_per_second=4) as view:
            while (elapsed := time.monotonic() - started) < duration and not stop.requested:
                progress.poll()
                title = f"livefit demo  {elapsed:4.0f}/{duration:.0f} s"
                view.update(_table(progress, predictor, title))
                stop.wait(0.5)
        return
    next_line = 0.0
    while (elapsed := time.monotonic() - started) < duration and not stop.requested:
        progress.poll()
        if elapsed >= next_line:
            console.print(
                f"{elapsed:5.1f}s trained={progress.get('livefit_train_samples_total'):.0f} "
                f"loss={_loss_text(progress.loss)} "
                f"version={progress.get('livefit_model_version'):.0f} "
                f"replica={progress.replica_version:.0f}"
            )
            next_line += 5.0
        stop.wait(0.5)


def has_learned(first: float | None, last: float | None, constant: float | None) -> bool:
    """Whether the run shows learning: the prequential loss fell from its first reading, or
    it is under a tenth of the loss of always predicting the targets' mean (``constant``): on a
    fast machine the model reaches the noise floor before the first reading."""
    if last is None:
        return False
    fell = first is not None and last < first
    return fell or (constant is not None and last < constant / 10)


def print_summary(
    console: Console, progress: Progress, predictor: PredictionLoad, elapsed: float,
    publisher: PublisherThread,
) -> bool:  # fmt: skip
    """Print the final table and a few lines (each under 80 columns); True if it learned."""
    progress.poll()
    title = f"livefit demo: summary after {elapsed:.0f} s"
    console.print(_table(progress, predictor, title, progress.whole_run_rates()))
    first, last = progress.first_loss, progress.loss
    constant = publisher.constant_loss
    learned = has_learned(first, last, constant)
    versus = f", vs {constant:.4g} for the mean" if constant is not None else ""
    console.print(
        f"prequential loss {_loss_text(first, 4)} -> {_loss_text(last, 5)}{versus}: "
        + ("[green]the model learned[/green]" if learned else "[red]no learning seen[/red]")
    )
    console.print(f"{len(predictor.latencies):,} predictions served, {predictor.errors} errors")
    if publisher.error:
        console.print(f"[red]publisher: {publisher.error[:60]}[/red]")
    return learned
