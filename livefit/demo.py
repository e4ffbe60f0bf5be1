"""``livefit demo``: broker, learner, replica, publisher and prediction traffic in one command.

It finds or starts a broker (``broker.url = "auto"``), starts ``livefit serve`` and
``livefit replica`` as child processes on free ports, streams a learnable noisy linear
function to the learner, sends prediction requests from a few concurrent clients, shows live
progress (the replica's version following the learner's), and stops everything after
``--duration`` seconds with a short summary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.live import Live
from rich.table import Table

MODEL = "demo"
INPUT_DIM = 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=30.0, help="seconds to run (default 30)")
    parser.add_argument("--rate", type=float, default=5000.0, help="samples/s to publish")
    parser.add_argument("--batch", type=int, default=10, help="samples per MQTT message")
    parser.add_argument("--clients", type=int, default=8, help="concurrent prediction clients")
    parser.add_argument("--broker", default="auto", help='broker URL or "auto" (default)')
    parser.add_argument("--port", type=int, default=0, help="HTTP port (default: a free one)")
    parser.add_argument("--workdir", help="where state and logs go (default: a temp dir)")
    parser.add_argument("--no-live", action="store_true", help="print lines instead of a live view")


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 when the model learned (prequential loss fell), else 1."""
    console = Console()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="livefit-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    from livefit.server.broker import resolve_broker

    address, managed = resolve_broker(args.broker, workdir)
    console.print(f"[bold]broker[/bold] {address} ({managed.kind if managed else 'existing'})")
    port = args.port or _free_port()
    config = _write_config(workdir, str(address), port, managed.protocol if managed else "5")
    server = _start(config, "serve", port, workdir / "server.log")
    replica_port = _free_port()
    replica = _start(config, "replica", replica_port, workdir / "replica.log")
    try:
        url = f"http://127.0.0.1:{port}"
        replica_url = f"http://127.0.0.1:{replica_port}"
        if not _wait_ready(url, server, timeout=120):
            console.print(f"[red]learner did not become ready; log: {workdir / 'server.log'}")
            return 1
        console.print(f"[bold]learner[/bold] {url} (log {workdir / 'server.log'})")
        if not _wait_ready(replica_url, replica, timeout=120):
            console.print(f"[red]replica did not become ready; log: {workdir / 'replica.log'}")
            return 1
        console.print(f"[bold]replica[/bold] {replica_url} (log {workdir / 'replica.log'})")
        return _run_traffic(args, console, url, replica_url, str(address))
    finally:
        _stop(replica)
        _stop(server)
        if managed is not None:
            managed.stop()


def _run_traffic(
    args: argparse.Namespace, console: Console, url: str, replica_url: str, broker: str
) -> int:
    stop = threading.Event()
    publisher = threading.Thread(
        target=_publish, args=(broker, args, stop), name="demo-publisher", daemon=True
    )
    predictor = _Predictor(url, args.clients)
    predictor.start()
    publisher.start()
    progress = _Progress(url, replica_url)
    try:
        _show(console, progress, predictor, args.duration, live=not args.no_live)
    finally:
        stop.set()
        predictor.stop()
        publisher.join(timeout=30)
    return _summary(console, progress, predictor)


def _publish(broker: str, args: argparse.Namespace, stop: threading.Event) -> None:
    from livefit.clients import publish

    parser = argparse.ArgumentParser()
    publish.add_arguments(parser)
    count = int(args.rate * args.duration) if args.rate > 0 else 10_000_000
    options = parser.parse_args(
        ["--broker", broker, "--model", MODEL, "--count", str(count), "--rate", str(args.rate),
         "--batch", str(args.batch), "--no-progress", "--input-shape", str(INPUT_DIM)]
    )  # fmt: skip
    options.stop_event = stop
    publish.run(options)


@dataclass
class _Predictor:
    """A few asyncio clients sending TF-Serving predict requests in a loop, on a thread."""

    url: str
    clients: int
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    versions: set[int] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True,
                                        name="demo-predictor")  # fmt: skip
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    async def _main(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=5) as client:
            await asyncio.gather(*(self._client(client, i) for i in range(self.clients)))

    async def _client(self, client: httpx.AsyncClient, index: int) -> None:
        rng = np.random.default_rng(index)
        while not self._stop.is_set():
            body = {"instances": rng.normal(size=(1, INPUT_DIM)).round(4).tolist()}
            started = time.perf_counter()
            try:
                response = await client.post(f"/v1/models/{MODEL}:predict", json=body)
            except httpx.HTTPError:
                self.errors += 1
                await asyncio.sleep(0.1)
                continue
            if response.status_code == 200:
                self.latencies.append(time.perf_counter() - started)
                self.versions.add(int(response.json()["model_version"]))
            else:
                self.errors += 1
                await asyncio.sleep(0.05)


class _Progress:
    """Reads the learner's /metrics and keeps the first and latest readings."""

    def __init__(self, url: str, replica_url: str) -> None:
        self.url = url
        self.replica_url = replica_url
        self.replica_version = 0.0
        self.first_loss: float | None = None
        self.latest: dict[str, float] = {}
        self.previous: tuple[float, dict[str, float]] | None = None
        self.rates: dict[str, float] = {}

    def poll(self) -> None:
        try:
            text = httpx.get(f"{self.url}/metrics", timeout=2).text
            replica = httpx.get(f"{self.replica_url}/v1/models/{MODEL}", timeout=2).json()
            self.replica_version = float(replica["model_version_status"][0]["version"])
        except (httpx.HTTPError, KeyError, ValueError):
            return
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.labels.get("model", MODEL) == MODEL and not sample.labels.get("le"):
                    key = sample.name
                    if sample.name == "livefit_predict_requests_total":
                        key = f"{sample.name}:{sample.labels.get('code')}"
                    values[key] = values.get(key, 0.0) + sample.value
        now = time.monotonic()
        if self.previous is not None:
            then, before = self.previous
            for key in ("livefit_train_samples_total", "livefit_predict_batch_size_count",
                        "livefit_predict_requests_total:200"):  # fmt: skip
                self.rates[key] = (values.get(key, 0) - before.get(key, 0)) / max(now - then, 1e-6)
        self.previous = (now, values)
        self.latest = values
        loss = values.get("livefit_prequential_loss")
        if self.first_loss is None and loss is not None and loss == loss and loss > 0:
            self.first_loss = loss

    def get(self, key: str) -> float:
        return self.latest.get(key, 0.0)

    def ratio(self, numerator: str, denominator: str) -> float:
        return self.get(numerator) / max(self.get(denominator), 1.0)


def _table(progress: _Progress, predictor: _Predictor, elapsed: float, duration: float) -> Table:
    table = Table(title=f"livefit demo  {elapsed:4.0f}/{duration:.0f} s", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    p = progress
    table.add_row("samples trained", f"{p.get('livefit_train_samples_total'):,.0f}")
    table.add_row("training samples/s", f"{p.rates.get('livefit_train_samples_total', 0):,.0f}")
    table.add_row(
        "mean train batch",
        f"{p.ratio('livefit_train_batch_size_sum', 'livefit_train_batch_size_count'):.1f}",
    )
    table.add_row("prequential loss", f"{p.get('livefit_prequential_loss'):.5f}")
    table.add_row("model version", f"{p.get('livefit_model_version'):,.0f}")
    table.add_row("serving version (learner)", f"{p.get('livefit_serving_version'):,.0f}")
    table.add_row("replica version", f"{p.replica_version:,.0f}")
    table.add_row("predictions/s", f"{p.rates.get('livefit_predict_requests_total:200', 0):,.0f}")
    table.add_row(
        "mean predict batch",
        f"{p.ratio('livefit_predict_batch_size_sum', 'livefit_predict_batch_size_count'):.1f}",
    )
    latencies = predictor.latencies[-2000:]
    if latencies:
        p50, p99 = np.percentile(latencies, [50, 99]) * 1000
        table.add_row("predict latency p50 / p99", f"{p50:.1f} / {p99:.1f} ms")
    return table


def _show(console: Console, progress: _Progress, predictor: _Predictor, duration: float,
          live: bool) -> None:  # fmt: skip
    started = time.monotonic()
    if live and console.is_terminal:
        with Live(console=console, refresh_per_second=4) as view:
            while (elapsed := time.monotonic() - started) < duration:
                progress.poll()
                view.update(_table(progress, predictor, elapsed, duration))
                time.sleep(0.5)
        return
    next_line = 0.0
    while (elapsed := time.monotonic() - started) < duration:
        progress.poll()
        if elapsed >= next_line:
            console.print(
                f"{elapsed:5.1f}s trained={progress.get('livefit_train_samples_total'):.0f} "
                f"loss={progress.get('livefit_prequential_loss'):.5f} "
                f"version={progress.get('livefit_model_version'):.0f} "
                f"replica={progress.replica_version:.0f}"
            )
            next_line += 5.0
        time.sleep(0.5)


def _summary(console: Console, progress: _Progress, predictor: _Predictor) -> int:
    progress.poll()
    console.print(_table(progress, predictor, 0, 0))
    first, last = progress.first_loss, progress.get("livefit_prequential_loss")
    learned = first is not None and last < first
    console.print(
        f"prequential loss {first if first is not None else float('nan'):.4f} -> {last:.5f}; "
        f"{len(predictor.latencies):,} predictions served, {predictor.errors} errors; "
        + ("[green]the model learned[/green]" if learned else "[red]no learning seen[/red]")
    )
    return 0 if learned else 1


def _write_config(workdir: Path, broker: str, port: int, protocol: str) -> Path:
    config = workdir / "demo.toml"
    config.write_text(
        f'[broker]\nurl = "{broker}"\nclient_id = "livefit-demo-{port}"\nprotocol = "{protocol}"\n'
        f'[http]\nport = {port}\n[storage]\ndir = "{workdir / "data"}"\n'
        f'[models.{MODEL}]\nbuilder = "mlp"\ninput_shape = [{INPUT_DIM}]\noutput_shape = [1]\n'
        f"learning_rate = 0.003\n[models.{MODEL}.train]\nmax_batch_size = 256\n"
    )
    return config


def _start(config: Path, command: str, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "livefit", command, "--config", str(config),
             "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip


def _wait_ready(url: str, server: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                return True
        time.sleep(0.25)
    return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
