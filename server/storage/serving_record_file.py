"""A model's serving record and the weights of the versions it names, on disk beside the
checkpoints (``<storage>/checkpoints/<model>/``), so labels and a pin survive a restart or a
SIGKILL and outlive the checkpoints that are pruned.

``serving.json`` holds the record (``wire.serving_record``); ``held-<version>.safetensors`` the
weight payload (the weight stream's format) of each version it names, bound by the sha256 the
record holds. Each file is written whole or not at all (``atomic_write``); a payload is written
before the record that names it, and removed only after a record that no longer names it.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from ..wire.serving_record import RecordError, ServingRecord
from .checkpoint import atomic_write

log = logging.getLogger(__name__)
RECORD_FILE = "serving.json"
HELD_PREFIX, HELD_SUFFIX = "held-", ".safetensors"


class ServingRecordFile:
    """The record and held payloads of the model whose checkpoints are in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def load(self) -> ServingRecord | None:
        """The record on disk; None when there is none or it cannot be read (logged)."""
        path = self.directory / RECORD_FILE
        try:
            return ServingRecord.decode(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, RecordError) as exc:
            log.error("serving record %s not read (%s): serving the newest version", path, exc)
            return None

    def save(self, record: ServingRecord) -> None:
        """Write ``record`` durably, then remove the payloads it no longer names."""
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write(self.directory / RECORD_FILE, record.encode().encode())
        for version in self.held_versions():
            if version not in record.versions:
                self.held_path(version).unlink(missing_ok=True)

    def held_path(self, version: int) -> Path:
        return self.directory / f"{HELD_PREFIX}{version:012d}{HELD_SUFFIX}"

    def save_held(self, version: int, payload: bytes) -> str:
        """Write version ``version``'s weight payload durably; its sha256 (hex)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write(self.held_path(version), payload)
        return hashlib.sha256(payload).hexdigest()

    def load_held(self, version: int, sha256: str) -> bytes | None:
        """The payload of ``version`` when its file is there and hashes to ``sha256``."""
        try:
            payload = self.held_path(version).read_bytes()
        except OSError:
            return None
        if hashlib.sha256(payload).hexdigest() != sha256:
            log.error("held weights of v%d in %s do not match the record: not served",
                      version, self.directory)  # fmt: skip
            return None
        return payload

    def held_versions(self) -> list[int]:
        """The versions whose payloads are on disk (by file name)."""
        found = []
        for path in self.directory.glob(f"{HELD_PREFIX}*{HELD_SUFFIX}"):
            digits = path.name[len(HELD_PREFIX) : -len(HELD_SUFFIX)]
            if digits.isascii() and digits.isdigit():
                found.append(int(digits))
        return sorted(found)
