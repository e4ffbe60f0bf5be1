"""The serving record: which version each label names, what the unversioned path serves (the
newest, a label, or a pinned version) and the rollbacks made, for one model of one learner.

One frozen type with its canonical JSON. The learner is its only writer: it keeps the record
beside the checkpoints and signs it into every weight envelope (``serving`` in the header), so
a replica serves the same version for the same label. ``guarded`` is the guard's hold (the
version serving keeps while the newest scores worse; ``serve.guard``): apart from the operator's
pin, which it never overrides. ``sequence`` counts the moves: a receiver
takes a record only with a higher sequence in the same lineage, so an old envelope replayed
cannot move a label back. ``versions`` binds every version the record names to the sha256 of
its weight payload: the payloads travel apart (a retained topic per version, a file beside the
checkpoints) and are checked against this signed hash, one signature for all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

LATEST = "latest"  # the label of the newest version: reserved, never moved by an operator
MAX_LABELS = 64  # labels per model: the record rides in every envelope header (64 KiB at most)
MAX_ROLLBACKS = 8  # rollbacks remembered (the newest): the lineage a receiver can read
LABEL = re.compile(r"[A-Za-z0-9_-]{1,64}")
ROLLBACK_MODES = ("serve", "train")


class RecordError(ValueError):
    """A record or a move that cannot be: the message names what to fix."""


def check_label(name: str) -> str:
    """``name`` if it may name a label an operator moves; RecordError otherwise."""
    if not LABEL.fullmatch(name):
        raise RecordError(f"a label is 1-64 of A-Z a-z 0-9 _ -, got {name[:70]!a}")
    if name == LATEST:
        raise RecordError(f"{LATEST!r} always names the newest version; it cannot be moved")
    return name


@dataclass(frozen=True, slots=True)
class Rollback:
    """One rollback: to ``source``; ``mode`` "serve" (serving held it) or "train" (the trainer
    went on from it as ``version``, a new number: no number ever names two sets of weights)."""

    source: int
    mode: str
    version: int
    at: float

    def as_json(self) -> dict[str, Any]:
        return {"source": self.source, "mode": self.mode, "version": self.version, "at": self.at}


@dataclass(frozen=True, slots=True)
class ServingRecord:
    """What a model's operator chose (module docstring); the empty record serves the newest."""

    model: str
    lineage: str = ""
    sequence: int = 0
    labels: Mapping[str, int] = field(default_factory=dict)
    default: str = LATEST  # the label the unversioned path serves while nothing is pinned
    pinned: int | None = None  # the version the unversioned path serves, whatever the labels
    guarded: int | None = None  # the guard's hold: served while nothing is pinned
    versions: Mapping[int, str] = field(default_factory=dict)  # named version -> payload sha256
    rollbacks: tuple[Rollback, ...] = ()
    moved_at: float = 0.0

    def named(self) -> set[int]:
        """The versions a label or the pin names (held while named)."""
        found = set(self.labels.values())
        found |= {v for v in (self.pinned, self.guarded) if v is not None}
        return found

    def served(self) -> int | None:
        """The version the unversioned path serves; None for the newest. The operator's pin
        first, then the guard's hold, then the default label."""
        if self.pinned is not None:
            return self.pinned
        if self.guarded is not None:
            return self.guarded
        return None if self.default == LATEST else self.labels.get(self.default)

    def label_version(self, label: str) -> int | None:
        """The version ``label`` names (None: ``latest``, the newest); KeyError when unknown."""
        if label == LATEST:
            return None
        return self.labels[label]

    def moved(self, at: float, **changes: Any) -> ServingRecord:
        """This record after one move (the next sequence), with ``versions`` trimmed to the
        versions still named."""
        after = replace(self, sequence=self.sequence + 1, moved_at=at, **changes)
        named = after.named()
        kept = {v: h for v, h in after.versions.items() if v in named}
        return replace(after, versions=kept, rollbacks=after.rollbacks[-MAX_ROLLBACKS:])

    def newer_than(self, other: ServingRecord | None) -> bool:
        """Whether a receiver holding ``other`` takes this one."""
        if other is None or other.lineage != self.lineage:
            return True
        return self.sequence > other.sequence

    def as_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "lineage": self.lineage,
            "sequence": self.sequence,
            "labels": dict(sorted(self.labels.items())),
            "default": self.default,
            "pinned": self.pinned,
            "guarded": self.guarded,
            "versions": {str(v): h for v, h in sorted(self.versions.items())},
            "rollbacks": [r.as_json() for r in self.rollbacks],
            "moved_at": self.moved_at,
        }

    def encode(self) -> str:
        """Canonical JSON (sorted keys, no spaces): one record, one text."""
        return json.dumps(self.as_json(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> ServingRecord:
        """The record ``text`` holds; RecordError naming what is wrong."""
        try:
            doc = json.loads(text)
            return cls._from_json(doc)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RecordError(f"not a serving record: {exc}") from None

    @classmethod
    def _from_json(cls, doc: dict[str, Any]) -> ServingRecord:
        labels = {check_label(str(k)): _count(v) for k, v in doc["labels"].items()}
        default = str(doc["default"])
        if default != LATEST and default not in labels:
            raise RecordError(f"the default label {default!r} names no version")
        pinned, guarded = doc.get("pinned"), doc.get("guarded")
        record = cls(
            model=str(doc["model"]),
            lineage=str(doc["lineage"]),
            sequence=_count(doc["sequence"]),
            labels=labels,
            default=default,
            pinned=None if pinned is None else _count(pinned),
            guarded=None if guarded is None else _count(guarded),
            versions={_count(int(k)): str(h) for k, h in doc["versions"].items()},
            rollbacks=tuple(_rollback(r) for r in doc.get("rollbacks", [])),
            moved_at=float(doc.get("moved_at", 0.0)),
        )
        if len(labels) > MAX_LABELS:
            raise RecordError(f"{len(labels)} labels, over {MAX_LABELS}")
        return record


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RecordError(f"a version or count is a non-negative integer, got {value!r}")
    return value


def _rollback(doc: Mapping[str, Any]) -> Rollback:
    mode = str(doc["mode"])
    if mode not in ROLLBACK_MODES:
        raise RecordError(f"a rollback's mode is one of {ROLLBACK_MODES}, got {mode!r}")
    return Rollback(_count(doc["source"]), mode, _count(doc["version"]), float(doc["at"]))
