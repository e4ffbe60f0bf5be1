"""The order the test workers take the files in (``tests/conftest.py``): the long
end-to-end files first, longest first, then the other end-to-end files, then the learning files
(the long ones first), then the unit files."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.conftest import E2E, LEARNING, LEARNING_LONGEST_FIRST, LONGEST_FIRST, _order

UNIT = Path(__file__).resolve().parents[1]


def test_every_long_file_named_exists() -> None:
    """A renamed or removed file would drop out of the order silently."""
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    for name in LONGEST_FIRST:
        assert (E2E / name).is_file(), name
    assert len(set(LEARNING_LONGEST_FIRST)) == len(LEARNING_LONGEST_FIRST)
    for name in LEARNING_LONGEST_FIRST:
        assert (LEARNING / name).is_file(), name


def test_long_end_to_end_files_first_then_the_others_then_unit_files() -> None:
    unit_file = UNIT / "config" / "test_settings.py"
    names = [unit_file, E2E / "test_lint.py", E2E / LONGEST_FIRST[-1],
             E2E / "test_batch_timeout_serve.py", E2E / LONGEST_FIRST[0]]  # fmt: skip
    items = [SimpleNamespace(path=path) for path in names]
    ordered = [item.path for item in sorted(items, key=_order)]  # type: ignore[arg-type]
    assert ordered == [E2E / LONGEST_FIRST[0], E2E / LONGEST_FIRST[-1], E2E / "test_lint.py",
                       E2E / "test_batch_timeout_serve.py", unit_file]  # fmt: skip


def test_learning_files_after_the_end_to_end_ones_and_before_the_unit_files() -> None:
    """The learning files, tens of seconds each, start before the many short unit files, which
    then even out the end; the long ones first among them."""
    unit_file = UNIT / "train" / "test_update_policy.py"
    other = LEARNING / "models" / "test_builders.py"
    names = [unit_file, other, LEARNING / LEARNING_LONGEST_FIRST[-1], E2E / "test_lint.py",
             LEARNING / LEARNING_LONGEST_FIRST[0]]  # fmt: skip
    items = [SimpleNamespace(path=path) for path in names]
    ordered = [item.path for item in sorted(items, key=_order)]  # type: ignore[arg-type]
    assert ordered == [E2E / "test_lint.py", LEARNING / LEARNING_LONGEST_FIRST[0],
                       LEARNING / LEARNING_LONGEST_FIRST[-1], other, unit_file]  # fmt: skip
