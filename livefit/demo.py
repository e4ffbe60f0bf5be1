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

This module owns the command (its options, ``run``) and the children: the learner's and
replica's config and processes. The parts live beside it: ``demo_stop`` (signals),
``demo_broker`` (which broker, and what the demo leaves on one), ``demo_traffic`` (the
publisher and prediction clients) and ``demo_view`` (progress and the summary).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console

from livefit.server.runtime.broker import ManagedBroker
from livefit.server.runtime.local_process import free_port, quiet_env, stop_all

from .demo_broker import DemoBroker, choose_broker, clear_retained
from .demo_stop import StopRequest
from .demo_traffic import INPUT_DIM, PredictionLoad, PublisherThread
from .demo_view import Progress, print_summary, show_progress
from .local_servers import LivefitProcess, NotReady

STOP_GRACE_S = 3.0  # children get SIGTERM, then SIGKILL after this long
READY_TIMEOUT_S = 300.0  # TensorFlow's import alone took 100 s on a busy 2-core machine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--duration", type=float, default=30.0, help="seconds to run (default: %(default)s)")
    add("--rate", type=float, default=5000.0, help="samples/s to publish (default: %(default)s)")
    add("--batch", type=int, default=10, help="samples per MQTT message (default: %(default)s)")
    add("--clients", type=int, default=8,
        help="concurrent prediction clients (default: %(default)s)")  # fmt: skip
    add(
        "--broker",
        default="auto",
        help='broker URL, or "auto" (the default): 127.0.0.1:1883 if a broker listens there, '
        "else one started for the demo",
    )
    add("--port", type=int, default=0, help="learner HTTP port (default: 0, a free one)")
    parser.add_argument(
        "--workdir", help="where state and logs go, kept (default: a temp dir, deleted on exit)"
    )
    parser.add_argument("--no-live", action="store_true", help="print lines instead of a live view")


def run(args: argparse.Namespace) -> int:
    """Run the demo: 0 when the model learned (prequential loss fell), 1 when not or when
    something failed, 128 + signal number when interrupted (130 for Ctrl-C)."""
    console = Console(highlight=False)
    stop = StopRequest()
    stop.install()
    temporary = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="livefit-demo-"))
    keep_workdir = not temporary
    model = f"demo-{secrets.token_hex(3)}"  # its own topics on a shared broker
    managed: ManagedBroker | None = None
    broker: DemoBroker | None = None
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        broker = choose_broker(args.broker, workdir, stop, console)
        if broker is None:
            return 1
        managed = broker.managed
        code, failed = _run_children(args, console, stop, workdir, model, broker)
        keep_workdir = keep_workdir or failed
        return code
    finally:
        apps = [child for child in stop.children if child is not managed]
        stop_all(apps, timeout=STOP_GRACE_S)  # learner and replica, then the broker
        if broker is not None and managed is None:
            clear_retained(broker.url, f"livefit/{model}/weights")
        if managed is not None:
            with contextlib.suppress(Exception):
                managed.stop()
        stop.restore()
        if not keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        elif temporary:
            console.print(f"logs kept in {workdir}")


def _run_children(
    args: argparse.Namespace, console: Console, stop: StopRequest, workdir: Path, model: str,
    broker: DemoBroker,
) -> tuple[int, bool]:  # fmt: skip
    """Start learner and replica, run the traffic; (exit status, whether something failed)."""
    from livefit.server.weights.keys import (
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
    config = _write_config(workdir, model, broker, port, key_file, public_file)
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
    code = _run_traffic(args, console, stop, model, server.url, replica.url, broker)
    return code, False


def _interrupted(stop: StopRequest) -> int:
    return 128 + (stop.signal or signal.SIGINT)


def _run_traffic(
    args: argparse.Namespace, console: Console, stop: StopRequest, model: str, url: str,
    replica_url: str, broker: DemoBroker,
) -> int:  # fmt: skip
    done = threading.Event()
    publisher = PublisherThread(broker.url, broker.protocol, model, args, done)
    predictor = PredictionLoad(url, model, args.clients)
    predictor.start()
    publisher.start()
    progress = Progress(url, replica_url, model)
    started = time.monotonic()
    try:
        show_progress(console, progress, predictor, args.duration, stop, live=not args.no_live)
    finally:
        done.set()
        predictor.stop()
        publisher.join(timeout=5)
    learned = print_summary(console, progress, predictor, time.monotonic() - started, publisher)
    if stop.requested:
        return _interrupted(stop)
    return 0 if learned else 1


def _toml(value: object) -> str:
    return json.dumps(str(value))  # a TOML basic string


def _write_config(
    workdir: Path, model: str, broker: DemoBroker, port: int, key_file: Path, public_file: Path
) -> Path:
    config = workdir / "demo.toml"
    config.write_text(
        f"[broker]\nurl = {_toml(broker.url)}\nclient_id = {_toml('livefit-' + model)}\n"
        f'protocol = "{broker.protocol}"\n'
        "session_expiry_s = 0  # nothing left on a shared broker once the demo ends\n"
        f"[http]\nport = {port}\n[storage]\ndir = {_toml(workdir / 'data')}\n"
        f'[models.{model}]\nbuilder = "mlp"\ninput_shape = [{INPUT_DIM}]\noutput_shape = [1]\n'
        f"learning_rate = 0.003\n[models.{model}.train]\nmax_batch_size = 256\n"
        f"[models.{model}.weights]\nsigning_key_file = {_toml(key_file)}\n"
        f"verify_key_file = {_toml(public_file)}\n"
    )
    return config


def _child(config: Path, workdir: Path, command: str, name: str, port: int) -> LivefitProcess:
    """``livefit <command>``, logging to ``workdir``/<name>.log, with the demo's config alone:
    the user's LIVEFIT_* overrides must not change it."""
    env = {k: v for k, v in quiet_env().items() if not k.upper().startswith("LIVEFIT_")}
    return LivefitProcess(config, workdir, command, name=name, port=port, env=env)
