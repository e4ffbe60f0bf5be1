"""A learning test runs in the test process alone, as a unit test does: one that starts a
process fails at once (the unit tests' guard, ``tests/unit/conftest.py``)."""

from __future__ import annotations

from tests.unit.conftest import no_child_processes

__all__ = ["no_child_processes"]
