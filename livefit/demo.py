"""``livefit demo``: broker, learner, replica, publisher and prediction traffic in one command.

It uses the broker on 127.0.0.1:1883 when one listens there (or the one ``--broker`` names),
else starts mosquitto on a free loopback port (or, without mosquitto, an embedded amqtt
broker); starts ``livefit serve`` and ``livefit replica`` as child processes on free ports,
streams a learnable noisy linear function to the learner, sends prediction requests from a
few concurrent clients, shows live progress (the replica's version following the learner's),
and stops everything after ``--duration`` seconds with a short summary.

The demo keeps to itself on a broker it shares: its model has a name of its own
(``demo-<random>``, so its topics ``livefit/demo-<random>/...`` meet no other learner's), its
learner's MQTT session ends with the connection (session expiry 0) and its temporary
directory is deleted on exit. Ctrl-C or SIGTERM stop it within seconds with the summary so
far; its child processes (learner, replica, a mosquitto it started) are killed by the kernel
when the demo dies in any way, SIGKILL included (Linux: ``PR_SET_PDEATHSIG``).

The weight stream is signed as everywhere else: the demo makes the learner's Ed25519 key in
its storage dir before starting anything, and its config names the private key (for the
learner) and the public key (for the replica), so both can start at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.live import Live
from rich.table import Table

from livefit.server.messaging.broker import ManagedBroker
from livefit.server.processes.local_processes import (
    LivefitProcess,
    LocalProcess,
    Mosquitto,
    NotReady,
    free_port,
    is_listening,
    quiet_env,
    stop_all,
)

INPUT_DIM = 8
STOP_GRACE_S = 3.0  # children get SIGTERM, then SIGKILL after this long
READY_TIMEOUT_S = 300.0  # TensorFlow's import alone took 100 s on a busy 2-core machine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.add_argument("--duration", type=float, default=30.0, help="seconds to run")
    parser.add_argument("--rate", type=float, default=5000.0, help="samples/s to publish")
    parser.add_argument("--batch", type=int, default=10, help="samples per MQTT message")
    parser.add_argument("--clients", type=int, default=8, help="concurrent prediction clients")
    parser.add_argument(
        "--broker",
        default="auto",
        help='broker URL, or "auto": 127.0.0.1:1883 if a broker listens there, else one '
        "started for the demo",
    )
    parser.add_argument("--port", type=int, default=0, help="learner HTTP port (0: a free one)")
    parser.add_argument(
        "--workdir", help="where state and logs go, kept (default: a temp dir, deleted on exit)"
    )
    parser.add_argument("--no-live", action="store_true", help="print lines instead of a live view")


class _Stop:
    """Set by SIGINT/SIGTERM instead of raising KeyboardInterrupt; a second signal kills the
    children at once."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal: int | None = None
        self.children: list[LocalProcess] = []
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.event.is_set():  # asked twice: no more waiting
            for child in self.children:
                child.kill()
            return
        self.signal = signum
        self.event.set()

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    def wait(self, seconds: float) -> bool:
        return self.event.wait(seconds)


def run(args: argparse.Namespace) -> int:
    """Run the demo: 0 when the model learned (prequential loss fell), 1 when not or when
    something failed, 128 + signal number when interrupted (130 for Ctrl-C)."""
    console = Console(highlight=False)
    stop = _Stop()
    stop.install()
    temporary = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="livefit-demo-"))
    keep_workdir = not temporary
    model = f"demo-{secrets.token_hex(3)}"  # its own topics on a shared broker
    managed: ManagedBroker | None = None
    broker = None
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        broker = _broker(args.broker, workdir, stop, console)
        if broker is None:
            return 1
        url, protocol, managed = broker
        code, failed = _run_children(args, console, stop, workdir, model, url, protocol)
        keep_workdir = keep_workdir or failed
        return code
    finally:
        apps = [child for child in stop.children if child is not managed]
        stop_all(apps, timeout=STOP_GRACE_S)  # learner and replica, then the broker
        if broker is not None and managed is None:
            _clear_retained(broker[0], f"livefit/{model}/weights")
        if managed is not None:
            with contextlib.suppress(Exception):
                managed.stop()
        stop.restore()
        if not keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        elif temporary:
            console.print(f"logs kept in {workdir}")


def _broker(
    url: str, workdir: Path, stop: _Stop, console: Console
) -> tuple[str, str, ManagedBroker | None] | None:
    """(URL, MQTT protocol, what to stop or None) of the broker to use; None (and why said)
    if there is none to use."""
    from livefit.server.messaging.broker import (
        DEFAULT_HOST,
        DEFAULT_PORT,
        BrokerAddress,
        EmbeddedAmqtt,
        parse_broker_url,
    )

    if url != "auto":
        try:
            address = parse_broker_url(url)
        except ValueError as exc:
            console.print(f"[red]--broker: {exc}[/red]")
            return None
        if not is_listening(address.host, address.port, timeout=2.0):
            console.print(
                f"[red]nothing listens at {address.host}:{address.port} ({address}): start "
                "the broker, or use --broker auto to let the demo start one[/red]"
            )
            return None
        return _connect_once(url, address, "given", console)
    if is_listening(DEFAULT_HOST, DEFAULT_PORT):
        address = BrokerAddress(DEFAULT_HOST, DEFAULT_PORT)
        return _connect_once(str(address), address, "already running; the demo uses its own "
                             "topics", console)  # fmt: skip
    if shutil.which("mosquitto"):
        child = Mosquitto(workdir / "mosquitto", persistence=False)
        stop.children.append(child)
        child.start()
        console.print(f"[bold]broker[/bold] {child.url} (mosquitto started for the demo)")
        return child.url, child.protocol, child
    try:
        embedded = EmbeddedAmqtt(port=free_port())
    except RuntimeError as exc:  # amqtt is not installed: say what to install
        console.print(f"[red]{exc}[/red]")
        return None
    address = BrokerAddress(DEFAULT_HOST, embedded.port)
    console.print(f"[bold]broker[/bold] {address} (embedded amqtt: MQTT 3.1.1, may lose samples)")
    return str(address), embedded.protocol, embedded


def _connect_once(
    url: str, address: Any, how: str, console: Console
) -> tuple[str, str, ManagedBroker | None] | None:
    """Connect to a broker the demo did not start, as its learner will: MQTT 5, or 3.1.1
    where the broker does not speak 5; None (and the broker's reason said) if it refuses."""
    from livefit.server.config import BrokerSettings
    from livefit.server.messaging.mqtt import probe

    settings, protocol = BrokerSettings(), "5"
    result = probe(address, settings, protocol)
    if getattr(result.refused, "value", None) == 0x84:  # unsupported protocol version
        protocol = "3.1.1"
        result = probe(address, settings, protocol)
    if not result.connected:
        console.print(f"[red]broker {address} ({how}): cannot connect: {result.describe()}[/red]")
        return None
    speaks = "" if protocol == "5" else "; MQTT 3.1.1 only"
    console.print(f"[bold]broker[/bold] {address} ({how}{speaks})")  # no password shown
    return url, protocol, None


def _run_children(
    args: argparse.Namespace, console: Console, stop: _Stop, workdir: Path, model: str,
    broker: str, protocol: str,
) -> tuple[int, bool]:  # fmt: skip
    """Start learner and replica, run the traffic; (exit status, whether something failed)."""
    from livefit.server.weights.weight_keys import (
        default_key_path,
        default_public_path,
        ensure_signing_key,
    )

    storage = workdir / "data"
    key_file, public_file = default_key_path(storage), default_public_path(storage)
    key, _ = ensure_signing_key(key_file, public_file)
    console.print(f"[bold]model[/bold] {model} (topics livefit/{model}/...)")
    console.print(f"[bold]weights[/bold] signed with Ed25519 key {key.key_id}")
    port = args.port or free_port()
    config = _write_config(workdir, model, broker, port, protocol, key_file, public_file)
    server = _child(config, workdir, "serve", "server", port)
    replica = _child(config, workdir, "replica", "replica", free_port())
    for child in (server, replica):
        stop.children.append(child.start(ready_timeout_s=None))
    for what, child in (("learner", server), ("replica", replica)):
        try:
            child.wait_ready(READY_TIMEOUT_S, stop=stop.event)
        except NotReady as failure:
            if stop.requested:
                console.print(f"interrupted while the {what} started; nothing to summarise")
                return _interrupted(stop), False
            console.print(f"[red]the {what} {failure.reason}; the end of its log:[/red]")
            console.print(child.tail(lines=15), markup=False)
            return 1, True
        console.print(f"[bold]{what}[/bold] {child.url}")
    code = _run_traffic(args, console, stop, model, server.url, replica.url, broker, protocol)
    return code, False


def _interrupted(stop: _Stop) -> int:
    return 128 + (stop.signal or signal.SIGINT)


def _run_traffic(
    args: argparse.Namespace, console: Console, stop: _Stop, model: str, url: str,
    replica_url: str, broker: str, protocol: str,
) -> int:  # fmt: skip
    done = threading.Event()
    publisher = _Publisher(broker, protocol, model, args, done)
    predictor = _Predictor(url, model, args.clients)
    predictor.start()
    publisher.start()
    progress = _Progress(url, replica_url, model)
    started = time.monotonic()
    try:
        _show(console, progress, predictor, args.duration, stop, live=not args.no_live)
    finally:
        done.set()
        predictor.stop()
        publisher.join(timeout=5)
    learned = _summary(console, progress, predictor, time.monotonic() - started, publisher)
    if stop.requested:
        return _interrupted(stop)
    return 0 if learned else 1


class _Publisher(threading.Thread):
    """Streams the synthetic function to the model's topic until ``done`` or the count."""

    def __init__(
        self, broker: str, protocol: str, model: str, args: argparse.Namespace,
        done: threading.Event,
    ) -> None:  # fmt: skip
        super().__init__(name="demo-publisher", daemon=True)
        self.broker, self.model, self.args, self.done = broker, model, args, done
        self.protocol: Any = protocol
        self.error: str | None = None

    def run(self) -> None:
        from livefit.clients.publish import PublishError, SamplePublisher
        from livefit.clients.synthetic import stream_chunks, stream_for_shape

        args = self.args
        count = int(args.rate * args.duration) if args.rate > 0 else 10_000_000
        chunk = args.batch * max(1, 4096 // args.batch)
        chunks = stream_chunks(stream_for_shape((INPUT_DIM,), 1, 0.01, 0), count, chunk)
        publisher = SamplePublisher(
            self.broker, f"livefit/{self.model}/samples", source=f"{self.model}-publisher",
            ack_timeout_s=5.0, protocol=self.protocol,
        )  # fmt: skip
        try:
            publisher.connect()
            publisher.publish_stream(chunks, batch=args.batch, rate=args.rate, stop=self.done)
        except (PublishError, ConnectionError) as exc:
            self.error = str(exc)
        finally:
            publisher.close()


@dataclass
class _Predictor:
    """A few asyncio clients sending TF-Serving predict requests in a loop, on a thread."""

    url: str
    model: str
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
            self._thread.join(timeout=5)

    async def _main(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=5) as client:
            await asyncio.gather(*(self._client(client, i) for i in range(self.clients)))

    async def _client(self, client: httpx.AsyncClient, index: int) -> None:
        rng = np.random.default_rng(index)
        while not self._stop.is_set():
            body = {"instances": rng.normal(size=(1, INPUT_DIM)).round(4).tolist()}
            started = time.perf_counter()
            try:
                response = await client.post(f"/v1/models/{self.model}:predict", json=body)
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

    def __init__(self, url: str, replica_url: str, model: str) -> None:
        self.url = url
        self.replica_url = replica_url
        self.model = model
        self.replica_version = 0.0
        self.first_loss: float | None = None
        self.latest: dict[str, float] = {}
        self.previous: tuple[float, dict[str, float]] | None = None
        self.rates: dict[str, float] = {}

    def poll(self) -> None:
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
            then, before = self.previous
            for key in ("livefit_train_samples_total", "livefit_predict_batch_size_count",
                        "livefit_predict_requests_total:200"):  # fmt: skip
                self.rates[key] = (values.get(key, 0) - before.get(key, 0)) / max(now - then, 1e-6)
        self.previous = (now, values)
        self.latest = values
        loss = self.loss
        if self.first_loss is None and loss is not None and loss > 0:
            self.first_loss = loss

    def get(self, key: str) -> float:
        return self.latest.get(key, 0.0)

    @property
    def loss(self) -> float | None:
        """The prequential loss, or None before anything was trained (the gauge reads 0)."""
        value = self.latest.get("livefit_prequential_loss")
        if value is None or value != value or self.get("livefit_train_samples_total") <= 0:
            return None
        return value

    def ratio(self, numerator: str, denominator: str) -> float:
        return self.get(numerator) / max(self.get(denominator), 1.0)


def _loss_text(loss: float | None, digits: int = 5) -> str:
    return "-" if loss is None else f"{loss:.{digits}f}"


def _table(progress: _Progress, predictor: _Predictor, title: str) -> Table:
    table = Table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    p = progress
    table.add_row("samples trained", f"{p.get('livefit_train_samples_total'):,.0f}")
    table.add_row("training samples/s", f"{p.rates.get('livefit_train_samples_total', 0):,.0f}")
    table.add_row(
        "mean train batch",
        f"{p.ratio('livefit_train_batch_size_sum', 'livefit_train_batch_size_count'):.1f}",
    )
    table.add_row("prequential loss", _loss_text(p.loss))
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
          stop: _Stop, live: bool) -> None:  # fmt: skip
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


def _summary(
    console: Console, progress: _Progress, predictor: _Predictor, elapsed: float,
    publisher: _Publisher,
) -> bool:  # fmt: skip
    """Print the final table and a few lines (each under 80 columns); True if it learned."""
    progress.poll()
    console.print(_table(progress, predictor, f"livefit demo: summary after {elapsed:.0f} s"))
    first, last = progress.first_loss, progress.loss
    learned = first is not None and last is not None and last < first
    console.print(
        f"prequential loss {_loss_text(first, 4)} -> {_loss_text(last, 5)}; "
        + ("[green]the model learned[/green]" if learned else "[red]no learning seen[/red]")
    )
    console.print(f"{len(predictor.latencies):,} predictions served, {predictor.errors} errors")
    if publisher.error:
        console.print(f"[red]publisher: {publisher.error[:60]}[/red]")
    return learned


def _toml(value: object) -> str:
    return json.dumps(str(value))  # a TOML basic string


def _write_config(
    workdir: Path, model: str, broker: str, port: int, protocol: str, key_file: Path,
    public_file: Path,
) -> Path:  # fmt: skip
    config = workdir / "demo.toml"
    config.write_text(
        f"[broker]\nurl = {_toml(broker)}\nclient_id = {_toml('livefit-' + model)}\n"
        f'protocol = "{protocol}"\n'
        "session_expiry_s = 0  # nothing left on a shared broker once the demo ends\n"
        f"[http]\nport = {port}\n[storage]\ndir = {_toml(workdir / 'data')}\n"
        f'[models.{model}]\nbuilder = "mlp"\ninput_shape = [{INPUT_DIM}]\noutput_shape = [1]\n'
        f"learning_rate = 0.003\n[models.{model}.train]\nmax_batch_size = 256\n"
        f"[models.{model}.weights]\nsigning_key_file = {_toml(key_file)}\n"
        f"verify_key_file = {_toml(public_file)}\n"
    )
    return config


def _clear_retained(broker: str, topic: str) -> None:
    """Delete the retained weights the demo's learner left on a broker the demo did not start
    (an empty retained message deletes it), so the user's broker keeps nothing of the demo."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    from livefit.server.messaging.broker import parse_broker_url

    address = parse_broker_url(broker)
    client = mqtt.Client(CallbackAPIVersion.VERSION2)
    if address.username is not None:
        client.username_pw_set(address.username, address.password)
    if address.tls:
        client.tls_set()
    try:
        client.connect(address.host, address.port, keepalive=10)
        client.loop_start()
        client.publish(topic, b"", qos=1, retain=True).wait_for_publish(3)
    except (OSError, ValueError, RuntimeError):
        pass  # best effort: the broker may be gone
    finally:
        client.disconnect()
        client.loop_stop()


def _child(config: Path, workdir: Path, command: str, name: str, port: int) -> LivefitProcess:
    """``livefit <command>``, logging to ``workdir``/<name>.log, with the demo's config alone:
    the user's LIVEFIT_* overrides must not change it."""
    env = {k: v for k, v in quiet_env().items() if not k.upper().startswith("LIVEFIT_")}
    return LivefitProcess(config, workdir, command, name=name, port=port, env=env)
