"""The ``livefit`` command: serve, replica, publish, versions, demo."""

from __future__ import annotations

import argparse
import socket
import sys
from typing import Any, NoReturn

from . import __version__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = list(sys.argv[1:] if argv is None else argv)  # a worker group reruns it
    if not hasattr(args, "handler"):
        parser.print_help()
        return 2
    from livefit.server.runtime.fork_server import name_process

    name_process()  # a group's process, started fresh or forked: its role in ``ps -o comm``
    return int(args.handler(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="livefit", description="Real-time online learning and inference server."
    )
    parser.add_argument("--version", action="version", version=f"livefit {__version__}")
    commands = parser.add_subparsers(title="commands")

    serve = commands.add_parser("serve", help="run the learner: MQTT in, training, HTTP API")
    serve.add_argument("--config", help="TOML config file (default: the bundled demo model)")
    serve.add_argument("--host", help="override http.host")
    serve.add_argument("--port", type=int, help="override http.port")
    serve.add_argument(
        "--workers",
        type=int,
        help="override http.workers: N >= 1 runs a training process and N serving processes "
        "behind the port (default: one per usable core beside training's, 1 to 4); 0 runs the "
        "whole learner in one process",
    )
    serve.set_defaults(handler=_serve)

    replica = commands.add_parser(
        "replica", help="serve predictions with weights from a learner's weight stream"
    )
    replica.add_argument(
        "--config",
        help="the learner's TOML config file, the same file (default: the bundled demo model, "
        "as `livefit serve` without --config)",
    )
    replica.add_argument("--host", help="override http.host")
    replica.add_argument("--port", type=int, help="override http.port")
    replica.add_argument(
        "--workers", type=int, help="override http.workers: serving processes behind the port"
    )
    replica.set_defaults(handler=_replica)

    from livefit.clients import publish
    from livefit.clients.publish_args import add_arguments

    pub = commands.add_parser("publish", help="stream samples to a model's MQTT topic")
    add_arguments(pub)
    pub.set_defaults(handler=publish.run)

    from livefit.clients import versions

    ver = commands.add_parser(
        "versions", help="labels, the pin and rollbacks of a model on a learner (admin routes)"
    )
    versions.add_arguments(ver)
    ver.set_defaults(handler=versions.run)

    from . import demo

    dem = commands.add_parser("demo", help="broker, server and publisher in one command")
    demo.add_arguments(dem)
    dem.set_defaults(handler=demo.run)
    return parser


def _settings(args: argparse.Namespace):
    """Load and validate the config, apply --host/--port, set up logging; None on error."""
    from livefit.server.base.logs import configure_logging
    from livefit.server.config.settings import ConfigError, load_settings

    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"livefit: {exc}", file=sys.stderr)
        return None
    if args.host:
        settings.http.host = args.host
    if args.port is not None:
        settings.http.port = args.port
    configure_logging(settings.logging.level, settings.logging.json_format)
    return settings


def _with_tensorflow(settings: Any, trains: bool = True) -> bool:
    """Import TensorFlow, set up its devices and thread pools, in a process that runs models (a
    worker group's parent only supervises: without TensorFlow it takes about 60 MiB, not 600);
    False (one line on stderr) when ``tensorflow.devices`` names a device it does not see and
    the process ``trains`` (a replica, which never trains, may share a learner's config on a
    machine without its GPUs)."""
    from livefit.server.base.tensorflow_start import import_tensorflow
    from livefit.server.config.settings import ConfigError

    import_tensorflow()  # first, so that its start-up noise is filtered
    from livefit.server.train.modeling import check_devices, configure_tensorflow

    configure_tensorflow(settings.tensorflow)
    if not trains:
        return True
    try:
        check_devices(settings.tensorflow)
    except ConfigError as exc:
        print(f"livefit: {exc}", file=sys.stderr)
        return False
    return True


MAX_WORKERS = 64  # as http.workers allows


def _apply_workers(args: argparse.Namespace, settings: Any, minimum: int) -> bool:
    """``--workers`` into ``settings.http.workers``; False (message on stderr) when out of
    ``minimum``..``MAX_WORKERS``."""
    if args.workers is None:
        return True
    if not minimum <= args.workers <= MAX_WORKERS:
        print(f"livefit: --workers must be {minimum} to {MAX_WORKERS}", file=sys.stderr)
        return False
    settings.http.workers = args.workers
    return True


def _keys_usable(settings: Any, signing: bool, verifying: bool, missing_ok: bool = False) -> bool:
    """The weight keys this command reads, read and parsed before anything starts; False (one
    line on stderr naming the file and what is wrong) when one is unusable."""
    from livefit.server.config.settings import ConfigError
    from livefit.server.weights.keys import check_signing_keys
    from livefit.server.weights.receiver_auth import check_verify_keys

    try:
        if signing:
            check_signing_keys(settings)
        if verifying:
            check_verify_keys(settings, missing_ok)
    except ConfigError as exc:
        print(f"livefit: {exc}", file=sys.stderr)
        return False
    return True


def _serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if settings is None:
        return 2
    if not _apply_workers(args, settings, minimum=0):
        return 2
    from livefit.server.runtime.learner_group import TrainingSlot, run_learner_group
    from livefit.server.runtime.workers import WorkerSlot

    training = TrainingSlot.from_env()
    slot = WorkerSlot.from_env()
    workers = settings.http.learner_workers()
    # A split learner's serving processes verify what its training process signs.
    if not _keys_usable(settings, signing=True, verifying=workers >= 1, missing_ok=True):
        return 2
    if training is None and slot is None and workers >= 1:  # the split learner's parent
        argv = [sys.executable, "-m", "livefit", *args.command_line]
        http = settings.http
        return run_learner_group(
            argv, workers, http.host, http.port, list(settings.models), http.worker_timeout_s,
            settings.processes.preload,
        )  # fmt: skip
    storage_lock = None
    if training is not None:
        from livefit.server.base.tensorflow_start import import_tensorflow
        from livefit.server.config.settings import ConfigError
        from livefit.server.storage.lock import StorageLocked

        try:  # before TensorFlow: the serving processes start as soon as it is held
            storage_lock = training.lock_storage(settings)
        except (StorageLocked, ConfigError) as exc:
            print(f"livefit: {exc}", file=sys.stderr)
            return 2
        import_tensorflow()  # quietly, before the training process's modules import it
        from livefit.server.runtime.training_process import size_training_pools

        size_training_pools(settings, training)  # before TensorFlow starts its pools
    elif slot is not None:  # a serving process: its CPUs before any thread starts
        from livefit.server.runtime.learner_group import pin_serving_process

        pin_serving_process(settings.processes, slot.count)
    if not _with_tensorflow(settings):
        return 2
    if training is not None:  # a split learner's training process
        from livefit.server.runtime.training_process import run_training

        _exit_stopped(run_training(settings, training, storage_lock))
    from livefit.server.runtime.http_server import run_server

    if slot is not None:  # one of a split learner's serving processes
        from livefit.server.runtime.learner_serving import LearnerServingRuntime

        _exit_stopped(run_server(settings, LearnerServingRuntime(settings, slot), slot))
    from livefit.server.runtime.learner import LearnerRuntime

    _exit_stopped(run_server(settings, LearnerRuntime(settings)))


def _replica(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if settings is None:
        return 2
    from livefit.server.runtime.workers import WorkerSlot, run_workers

    if not _apply_workers(args, settings, minimum=1):
        return 2
    if not _keys_usable(settings, signing=False, verifying=True):
        return 2
    slot = WorkerSlot.from_env()
    workers = settings.http.replica_workers()
    if slot is None and workers > 1:  # the worker group's parent
        argv = [sys.executable, "-m", "livefit", *args.command_line]
        http = settings.http
        return run_workers(
            argv, workers, http.host, http.port, http.worker_timeout_s, settings.processes.preload
        )
    _with_tensorflow(settings, trains=False)
    from livefit.server.runtime.http_server import run_server
    from livefit.server.runtime.replica import ReplicaRuntime

    if slot is not None:  # one of a worker group's processes
        instance = f"{socket.gethostname()}-{settings.http.port}-w{slot.index}"
        _exit_stopped(run_server(settings, ReplicaRuntime(settings, instance=instance), slot))
    _exit_stopped(run_server(settings, ReplicaRuntime(settings)))


def _exit_stopped(code: int) -> NoReturn:
    """End a process that ran models, its parts stopped, without Python's teardown of
    TensorFlow (``tensorflow_start.exit_without_teardown``): a stop waits for none of it."""
    from livefit.server.base.tensorflow_start import exit_without_teardown

    exit_without_teardown(code)


if __name__ == "__main__":
    sys.exit(main())
