"""What every benchmark shares: run sizes, spreads, targets, result records, the registration.

A benchmark measures livefit and its comparisons side by side in one run, repeated and
interleaved, and reports medians with their spread (min-max over the repeats) and the ratios of
paired repeats, never one absolute time. A result is plain JSON (``BenchResult.to_json``), so
``BENCHMARKS.md`` can be regenerated from ``bench/results/latest.json`` and the notes written by
hand in ``docs/benchmarks/``.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich.console import Console

if TYPE_CHECKING:
    from bench.fleet import Fleet
    from livefit.local_servers import LivefitProcess
    from livefit.server.runtime.mosquitto import Mosquitto

Mode = Literal["quick", "full", "soak"]
Op = Literal[">=", "<=", "<"]
REPO = Path(__file__).resolve().parent.parent
NOTES = REPO / "docs" / "benchmarks"


def prose(name: str) -> str:
    """The notes ``docs/benchmarks/<name>.md``, written by hand, whole (trailing newlines
    dropped): the learning benchmark's fragments, which its report includes."""
    return (NOTES / f"{name}.md").read_text().rstrip("\n")


def lead(name: str) -> str | None:
    """The lead of ``docs/benchmarks/<name>.md``: the paragraphs between its title and its
    first ``## `` heading, in one line each; None when the benchmark has no notes."""
    path = NOTES / f"{name}.md"
    if not path.exists():
        return None
    body = path.read_text().split("\n## ", 1)[0].split("\n", 1)[1]
    return "\n\n".join(" ".join(p.split()) for p in body.strip().split("\n\n"))


@dataclass(frozen=True, slots=True)
class Spread:
    """Repeated measurements of one figure: the median and the range around it."""

    median: float
    low: float
    high: float
    n: int
    unit: str
    values: tuple[float, ...] = ()

    @classmethod
    def of(cls, values: Sequence[float], unit: str) -> Spread:
        """The spread of ``values`` (at least one)."""
        if not values:
            raise ValueError("a spread needs at least one value")
        clean = [float(v) for v in values]
        return cls(statistics.median(clean), min(clean), max(clean), len(clean), unit, tuple(clean))

    def to_json(self) -> dict[str, Any]:
        return {
            "median": self.median,
            "min": self.low,
            "max": self.high,
            "n": self.n,
            "unit": self.unit,
            "values": list(self.values),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Spread:
        return cls(
            data["median"],
            data["min"],
            data["max"],
            data["n"],
            data["unit"],
            tuple(data.get("values", ())),
        )


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> Spread:
    """Ratios of interleaved repeats (a / b of the same round): drift cancels within a round."""
    if len(numerators) != len(denominators):
        raise ValueError(f"{len(numerators)} numerators but {len(denominators)} denominators")
    ratios = [
        a / b if b > 0 else float("inf") for a, b in zip(numerators, denominators, strict=True)
    ]
    return Spread.of(ratios, "x")


@dataclass(frozen=True, slots=True)
class Target:
    """A promise: ``observed op value``, judged on the median of ``subject``."""

    subject: str  # a key of the row's figures or ratios
    op: Op
    value: float
    observed: float
    label: str = ""

    @property
    def passed(self) -> bool:
        if self.op == ">=":
            return self.observed >= self.value
        if self.op == "<=":
            return self.observed <= self.value
        return self.observed < self.value

    def to_json(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "op": self.op,
            "value": self.value,
            "observed": self.observed,
            "label": self.label,
            "pass": self.passed,
        }


@dataclass
class Row:
    """One case of a benchmark (a batch size, a message format, a client count and server)."""

    case: dict[str, Any]
    figures: dict[str, Spread] = field(default_factory=dict)
    ratios: dict[str, Spread] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)

    def target(self, subject: str, op: Op, value: float, label: str = "") -> Target:
        """Add a target on a ratio or figure of this row (judged on its median)."""
        spread = self.ratios.get(subject) or self.figures.get(subject)
        if spread is None:
            raise KeyError(f"row {self.case} has no figure or ratio {subject!r}")
        target = Target(subject, op, value, spread.median, label)
        self.targets.append(target)
        return target

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "figures": {k: v.to_json() for k, v in self.figures.items()},
            "ratios": {k: v.to_json() for k, v in self.ratios.items()},
            "targets": [t.to_json() for t in self.targets],
        }


@dataclass
class BenchResult:
    """Everything one benchmark measured, with the facts needed to read it."""

    name: str
    title: str
    what: str  # how it is measured, in a few sentences of Markdown
    sides: dict[str, str]  # side name -> how it runs (its settings)
    settings: dict[str, Any] = field(default_factory=dict)  # shared by every side
    rows: list[Row] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)  # e.g. zero loss, same outputs
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # raw figures worth keeping

    def check(self, what: str, passed: bool, detail: str = "") -> None:
        """Record a correctness check (it is shown with the table; a failure is loud)."""
        self.checks.append({"what": what, "pass": bool(passed), "detail": detail})

    def merge_checks(self) -> None:
        """One line per distinct check: it passes only if every repeat of it passed."""
        merged: dict[str, dict[str, Any]] = {}
        for check in self.checks:
            seen = merged.setdefault(check["what"], dict(check))
            if not check["pass"]:
                seen.update(check)
        self.checks = list(merged.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "what": self.what,
            "sides": self.sides,
            "settings": self.settings,
            "rows": [r.to_json() for r in self.rows],
            "checks": self.checks,
            "notes": self.notes,
            "extra": self.extra,
        }


class SharedFleet:
    """What a quick run shares between benchmarks, each started on first use: the fleet (a
    broker, a one-process learner and a replica of every shared model) and a split learner
    of the same models (``http.workers = 1``) on a broker and storage of its own. Starting
    TensorFlow processes is most of a quick run's time; a split learner starts three."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.fleet: Fleet | None = None
        self._split: tuple[Mosquitto, LivefitProcess] | None = None
        self._split_stack = contextlib.ExitStack()

    def get(self) -> Fleet:
        from bench.fleet import SHARED, Fleet, bench_tables

        if self.fleet is None:
            self.fleet = Fleet(self.workdir, bench_tables(SHARED), replica=True, tag="shared")
            try:
                self.fleet.start()
            except BaseException:
                self.fleet.stop()
                self.fleet = None
                raise
        return self.fleet

    def split(self) -> tuple[Mosquitto, LivefitProcess]:
        """The shared split learner and its broker."""
        from bench.config import learner_config
        from bench.fleet import SHARED, bench_tables
        from bench.procs import started_own_learner

        if self._split is None:
            text = learner_config("mqtt://127.0.0.1:1", "-", "bench-split", bench_tables(SHARED))
            self._split = self._split_stack.enter_context(
                started_own_learner(text, self.workdir, "split-learner", 1)
            )
        return self._split

    def stop(self) -> None:
        self._split_stack.close()
        self._split = None
        if self.fleet is not None:
            self.fleet.stop()
            self.fleet = None


@dataclass
class Context:
    """How big a run is, where it may write, and where it reports progress."""

    mode: Mode
    workdir: Path
    console: Console
    load_client: str = "auto"  # "auto" (wrk when on PATH), "wrk" or "python"
    shared: SharedFleet | None = None  # quick runs share one fleet
    sizes: dict[str, Any] = field(default_factory=dict)  # the benchmark's, for this mode

    @contextlib.contextmanager
    def fleet(self, *models: str, replica: bool = False) -> Iterator[Fleet]:
        """Broker + learner (+ replica) holding ``models``: shared in quick runs, else fresh."""
        from bench.fleet import fleet_for

        shared = self.shared.get() if self.shared is not None else None
        with fleet_for(self.workdir / "fleet", models, replica, shared) as fleet:
            yield fleet

    @contextlib.contextmanager
    def split_learner(
        self, config_text: str, name: str
    ) -> Iterator[tuple[Mosquitto, LivefitProcess]]:
        """A split learner (``http.workers = 1``) of ``config_text``'s models and its own
        broker, started: in quick runs the shared one (which holds every shared model), else
        a new one named ``name``, stopped on exit."""
        if self.shared is not None:
            yield self.shared.split()
            return
        from bench.procs import started_own_learner

        with started_own_learner(config_text, self.workdir / name, name, 1) as started:
            yield started

    @property
    def quick(self) -> bool:
        return self.mode == "quick"

    def step(self, message: str) -> None:
        """One line of progress, time-stamped."""
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}", highlight=False)


@dataclass(frozen=True, slots=True)
class Sizes:
    """A benchmark's parameters at each size of run: ``quick`` checks the harness, ``full``
    measures, ``soak`` (keys overriding ``full``) runs long. Quick and full name the same keys."""

    quick: Mapping[str, Any] = field(default_factory=dict)
    full: Mapping[str, Any] = field(default_factory=dict)
    soak: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if set(self.quick) != set(self.full) or not set(self.soak) <= set(self.full):
            raise ValueError(f"sizes name different keys: {self.quick}, {self.full}, {self.soak}")

    def of(self, mode: Mode) -> dict[str, Any]:
        """The parameters for a run of ``mode``."""
        if mode == "quick":
            return dict(self.quick)
        return {**self.full, **(self.soak if mode == "soak" else {})}


@dataclass(frozen=True, slots=True)
class Benchmark:
    """A registered benchmark (``bench.registry``): what it compares, how it runs at each size,
    and how its section of BENCHMARKS.md is rendered from its ``BenchResult`` JSON.

    ``sizes`` are read by ``run`` as ``ctx.sizes``; a benchmark whose quick run is another plan
    rather than smaller numbers (fewer sides, fewer streams) reads ``ctx.quick`` instead.
    ``columns``: the figures and ratios its table in BENCHMARKS.md shows (default: those its
    targets judge); ``table``: that table's renderer instead, when the standard one does not
    fit. ``section``: its section of ``bench/results/latest.figures.md``, every figure (None:
    the standard one, ``bench.report``). ``explained_always``: the lead of its notes
    (``docs/benchmarks/<name>.md``) is shown even when every target passes."""

    name: str
    summary: str
    run: Callable[[Context], BenchResult]
    sizes: Sizes = field(default_factory=Sizes)
    columns: tuple[str, ...] = ()
    table: Callable[[dict[str, Any]], list[str]] | None = None
    section: Callable[[dict[str, Any]], str] | None = None
    explained_always: bool = False
