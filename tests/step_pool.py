"""Trainers' compiled steps shared between unit tests: a trainer's step costs 1-1.5 s to trace
and first run (``TrainStep.warm_up``), and hundreds of unit tests each build a trainer of the
same few settings. ``pooled_steps()`` around ``Trainer(...)`` gives the new trainer a model and
a traced step that an earlier test built from the same settings (those that reach the model or
the step: two trainers that differ in their loop's settings, replay, drift or checkpoints,
share one; ``LOOP_ONLY``), with every variable (weights,
optimizer state, averages, rollback and rewind copies, seed state) and the step's own Python
state put back to what they were when that step was built, as a fresh one would be; the
trainer around it (queue, progress, policy, accounting, checkpointing) is built anew.

A step is lent to one trainer at a time: a test that builds two trainers of the same settings
gets two steps. What a test borrowed is given back when it ends (``release_all``, from the
autouse fixture ``shared_trainer_steps`` in ``tests/unit/conftest.py``); outside a unit test
(``tests/learning`` imports the unit helpers) nothing is pooled and every trainer is built
afresh.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from livefit.server.config.model import ModelSettings
from livefit.server.train import trainer as trainer_module
from livefit.server.train.train_step import TrainStep


@dataclass
class _Entry:
    key: str
    model: Any
    step: TrainStep | None = None
    step_key: str = ""
    variables: list[Any] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)
    states: list[tuple[Any, type, dict[str, Any]]] = field(default_factory=list)

    def snapshot(self) -> None:
        """Record the step's variables and Python state as built, before any warm-up."""
        assert self.step is not None
        seen: dict[int, Any] = {}
        sv = self.step._variables
        owners = [self.model.variables, self.model.optimizer.variables, sv.state, sv.backup,
                  sv.averages, [sv.averaged], sv.others, sv.others_backup,
                  [v for pair in sv.copies for v in pair]]  # fmt: skip
        for group in owners:
            for v in group:
                seen.setdefault(id(v), v)
        self.variables = list(seen.values())
        self.values = [np.array(v.numpy(), copy=True) for v in self.variables]
        self.states = [
            (obj, type(obj), _copied(_state(obj))) for obj in (self.step, self.step._graph, sv)
        ]

    def covers_the_traced_graphs(self) -> bool:
        """Whether every variable the warmed-up step's graphs use was recorded (else a reset
        could leave one changed, and the entry is not lent again)."""
        assert self.step is not None
        known = {_handle(v) for v in self.variables}
        used = list(self.step._call.variables) if hasattr(self.step._call, "variables") else []
        return all(_handle(v) in known for v in used)

    def reset(self) -> None:
        for v, value in zip(self.variables, self.values, strict=True):
            v.assign(value)
        for obj, cls, state in self.states:
            obj.__class__ = cls
            if hasattr(obj, "__dict__"):
                vars(obj).clear()
            for name, value in _copied(state).items():
                object.__setattr__(obj, name, value)


def _handle(v: Any) -> int:
    return id(getattr(v, "_value", v))  # a Keras variable wraps a TensorFlow one


def _state(obj: Any) -> dict[str, Any]:
    """An object's attributes, whether in its ``__dict__`` or its slots."""
    if hasattr(obj, "__dict__"):
        return dict(vars(obj))
    names = [n for c in type(obj).__mro__ for n in getattr(c, "__slots__", ())]
    return {n: getattr(obj, n) for n in names if hasattr(obj, n)}


def _copied(state: dict[str, Any]) -> dict[str, Any]:
    """A shallow copy, with arrays, lists and dicts copied (a step may change them in place)."""
    return {k: copy.copy(v) if isinstance(v, np.ndarray | list | dict) else v
            for k, v in state.items()}  # fmt: skip


# What the trainer's loop reads, never the model's build or the step's construction
# (``modeling.build_compiled``, the ``TrainStep(...)`` call in ``trainer.py``): two trainers that
# differ only here can share a step. The step's own arguments are checked on every loan.
LOOP_ONLY = ("checkpoint", "dead_letter_topic", "dedup", "drift", "guard", "labels",
              "max_message_bytes", "max_samples_per_message", "metrics", "prequential_window",
              "selection", "serve", "silent_topic_warn_s", "stall_after_s", "topic", "versions",
              "weights")  # fmt: skip
STEP_TRAIN_FIELDS = ("weight_average", "pipeline")


def model_and_step_settings(settings: ModelSettings) -> str:
    """The settings that can change the model built or its step, as a pool key."""
    fields = settings.model_dump(mode="json", exclude=set(LOOP_ONLY))
    fields["train"] = {k: fields["train"][k] for k in STEP_TRAIN_FIELDS}
    return json.dumps(fields, sort_keys=True)


_pool: dict[str, list[_Entry]] = {}
_lent: list[_Entry] = []
_active = False


def activate() -> None:
    global _active
    _active = True


def release_all() -> None:
    """Give back what the ending test borrowed (its trainers' threads have ended: the suite
    fails a test that leaves a thread behind)."""
    global _active
    _active = False
    for entry in _lent:
        if entry.step is not None and entry.covers_the_traced_graphs():
            _pool.setdefault(entry.key, []).append(entry)
    _lent.clear()


@contextlib.contextmanager
def pooled_steps() -> Iterator[None]:
    """Within: ``Trainer(...)`` takes a pooled model and step of its settings where there is
    one free, else builds them and adds them to the pool when the test ends."""
    if not _active:
        yield
        return
    build_compiled, train_step = trainer_module.build_compiled, trainer_module.TrainStep
    by_model: dict[int, _Entry] = {}

    def pooled_model(settings: ModelSettings, placement: Any) -> Any:
        key = f"{model_and_step_settings(settings)}|{placement!r}"
        free = _pool.get(key, [])
        entry = free.pop() if free else _Entry(key, build_compiled(settings, placement))
        _lent.append(entry)
        by_model[id(entry.model)] = entry
        return entry.model

    def pooled_step(model: Any, *args: Any, **kwargs: Any) -> TrainStep:
        entry = by_model[id(model)]
        step_key = repr((args[1:], sorted(kwargs.items())))  # all but the loss function
        if entry.step is None:
            entry.step, entry.step_key = train_step(model, *args, **kwargs), step_key
            entry.snapshot()
        else:
            assert entry.step_key == step_key, (entry.step_key, step_key)
            entry.reset()
        return entry.step

    trainer_module.build_compiled = pooled_model  # type: ignore[assignment]
    trainer_module.TrainStep = pooled_step  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        trainer_module.build_compiled, trainer_module.TrainStep = build_compiled, train_step
