"""The livefit processes every benchmark talks to: a broker, a learner, a replica.

In a full run each benchmark gets a fresh fleet with only its own model, stopped when it ends,
so no benchmark inherits another's state. In ``--quick`` mode (which checks the harness, not
the speed) one fleet holding every benchmark model, each under its own name, serves the whole
run: starting TensorFlow processes is most of a quick run's time on a small machine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from bench.config import learner_config
from bench.models import LSTM, MLP, ModelSpec
from bench.procs import livefit_server, running, wait_all
from livefit.local_servers import LivefitProcess
from livefit.server.runtime.mosquitto import Mosquitto

# Every model a benchmark asks a fleet for: one name per benchmark, so that counters and
# weights of one never mix with another's when a quick run shares the fleet. Settings are
# livefit's defaults unless the extra keys of the model's table say otherwise.
_REFUSE_ALL = {
    "batch_timeout_ms": 10_000,
    "max_batch_timeout_ms": 10_000,
    "max_queue_rows": 1,
    "default_deadline_ms": 60_000,
}
MODELS: dict[str, tuple[ModelSpec, dict[str, Any]]] = {
    "ingest": (MLP, {}),  # ingestion
    "ingest1k": (MLP, {"train": {"max_batch_size": 1024}}),  # ingestion, informative
    "mlp": (MLP, {}),  # serving (the name is in the URL every peer serves too)
    "lstm": (LSTM, {}),  # serving, full runs
    # serving: the same models on the graph runtime of before (serve.runtime = "keras")
    "mlp_keras": (MLP, {"serve": {"runtime": "keras"}}),
    "lstm_keras": (LSTM, {"serve": {"runtime": "keras"}}),
    "fresh": (MLP, {}),  # freshness
    "busy": (MLP, {}),  # interference
    "soak": (MLP, {}),  # memory
    "over": (MLP, {}),  # overload
    "over_keras": (MLP, {"serve": {"runtime": "keras"}}),  # overload, the runtime of before
    # overload, refusals only: one request waits 10 s for company and holds the one row its
    # queue may hold, so every other request is refused from its head (the cost of a refusal)
    "over_refuse": (MLP, {"serve": _REFUSE_ALL}),
    # batching (bench/batching.py): the same mlp under each serve.batch_timeout_ms
    **{
        f"mlp_t{key}": (MLP, {"serve": {"batch_timeout_ms": value}})
        for key, value in (("0", 0), ("1", 1), ("5", 5), ("auto", "auto"), ("0b", 0))
    },
}
SHARED = (
    "ingest",
    "ingest1k",
    "mlp",
    "mlp_keras",
    "fresh",
    "busy",
    "soak",
    "over",
    "over_keras",
    "over_refuse",
    "mlp_t0",
    "mlp_tauto",
)


def bench_tables(models: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The ``[models.<name>]`` tables of benchmark models ``models`` (names of ``MODELS``)."""
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise ValueError(f"no benchmark model {unknown}; known: {sorted(MODELS)}")
    return {m: {**MODELS[m][0].table(), **MODELS[m][1]} for m in models}


class Fleet:
    """A mosquitto, a ``livefit serve`` with a model per table and optionally a replica.

    ``tables``: model name -> its ``[models.<name>]`` table (``bench_tables`` for the bench's
    own models, or any table a user would write)."""

    def __init__(
        self,
        workdir: Path,
        tables: Mapping[str, Mapping[str, Any]],
        replica: bool = False,
        tag: str = "bench",
    ) -> None:
        self.models = tuple(tables)
        self.broker = Mosquitto(workdir / "broker", persistence=False)
        storage = str(workdir / "storage")
        config = learner_config(self.broker.url, storage, f"bench-{tag}", tables)
        self.learner = livefit_server("learner", config, workdir)
        self.replica: LivefitProcess | None = None
        if replica:
            self.replica = livefit_server("replica", config, workdir, command="replica")
        self._stack = contextlib.ExitStack()

    @property
    def servers(self) -> list[LivefitProcess]:
        return [self.learner] + ([self.replica] if self.replica else [])

    def start(self, ready_timeout_s: float = 180.0) -> Fleet:
        self._stack.enter_context(running(self.broker, *self.servers))
        self.broker.start()
        for server in self.servers:  # the replica is ready once the learner's v0 reaches it
            server.start(ready_timeout_s=None)
        wait_all(self.servers, ready_timeout_s)
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
    fleet = Fleet(workdir, bench_tables(models), replica, tag=workdir.name)
    try:
        yield fleet.start()
    finally:
        fleet.stop()
