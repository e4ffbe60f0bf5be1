"""The livefit processes the MQTT and HTTP benchmarks talk to: a broker, a learner, a replica.

In a full run each benchmark gets a fresh fleet with only its own model, stopped when it ends,
so no benchmark inherits another's state. In ``--quick`` mode (which checks the harness, not
the speed) one fleet holding every benchmark model, each under its own name, serves the whole
run: starting TensorFlow processes is most of a quick run's time on a small machine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from bench.models import LSTM, MLP, ModelSpec, learner_config
from bench.procs import livefit_server, wait_all
from livefit.server.local_processes import LivefitProcess, Mosquitto, running

# Every model a benchmark asks a fleet for: one name per benchmark, so that counters and
# weights of one never mix with another's when a quick run shares the fleet. Settings are
# livefit's defaults unless the extra TOML says otherwise.
MODELS: dict[str, tuple[ModelSpec, str]] = {
    "ingest": (MLP, ""),  # ingestion
    "ingest1k": (MLP, "[models.ingest1k.train]\nmax_batch_size = 1024\n"),  # ingestion, informative
    "mlp": (MLP, ""),  # serving (the name is in the URL every peer serves too)
    "lstm": (LSTM, ""),  # serving, full runs
    "fresh": (MLP, ""),  # freshness
    "busy": (MLP, ""),  # interference
    "soak": (MLP, ""),  # memory
    "over": (MLP, ""),  # overload
    # batching (bench/batching.py): the same mlp under each serve.batch_timeout_ms
    **{
        f"mlp_t{key}": (MLP, f"[models.mlp_t{key}.serve]\nbatch_timeout_ms = {value}\n")
        for key, value in (("0", "0"), ("1", "1"), ("5", "5"), ("auto", '"auto"'), ("0b", "0"))
    },
}
SHARED = (
    "ingest",
    "ingest1k",
    "mlp",
    "fresh",
    "busy",
    "soak",
    "over",
    "mlp_t0",
    "mlp_tauto",
)


def section(name: str) -> str:
    """The ``[models.<name>]`` tables of benchmark model ``name``."""
    spec, extra = MODELS[name]
    return spec.toml().replace(f"[models.{spec.name}]", f"[models.{name}]") + extra


class Fleet:
    """A mosquitto, a ``livefit serve`` with ``models`` and optionally a ``livefit replica``."""

    def __init__(self, workdir: Path, models: tuple[str, ...], replica: bool, tag: str) -> None:
        unknown = [m for m in models if m not in MODELS]
        if unknown:
            raise ValueError(f"no benchmark model {unknown}; known: {sorted(MODELS)}")
        self.models = models
        self.broker = Mosquitto(workdir / "broker", persistence=False)
        sections = [section(m) for m in models]
        config = learner_config(self.broker.url, str(workdir / "storage"), f"bench-{tag}", sections)
        self.learner = livefit_server("learner", config, workdir)
        self.replica: LivefitProcess | None = None
        if replica:
            self.replica = livefit_server("replica", config, workdir, command="replica")
        self._stack = contextlib.ExitStack()

    @property
    def servers(self) -> list[LivefitProcess]:
        return [self.learner] + ([self.replica] if self.replica else [])

    def start(self) -> Fleet:
        self._stack.enter_context(running(self.broker, *self.servers))
        self.broker.start()
        for server in self.servers:  # the replica is ready once the learner's v0 reaches it
            server.start(ready_timeout_s=None)
        wait_all(self.servers)
        return self

    def has(self, models: tuple[str, ...], replica: bool) -> bool:
        return set(models) <= set(self.models) and (self.replica is not None or not replica)

    def stop(self) -> None:
        self._stack.close()


@contextlib.contextmanager
def fleet_for(
    workdir: Path, models: tuple[str, ...], replica: bool, shared: Fleet | None
) -> Iterator[Fleet]:
    """The shared fleet when it has what is asked for, else a new one stopped on exit."""
    if shared is not None and shared.has(models, replica):
        yield shared
        return
    fleet = Fleet(workdir, models, replica, tag=workdir.name)
    try:
        yield fleet.start()
    finally:
        fleet.stop()
