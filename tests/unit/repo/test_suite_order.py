"""The order the two test workers take the files in (``tests/conftest.py``): the long
end-to-end files first, longest first, then the other end-to-end files, then the unit files."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.conftest import E2E, LONGEST_FIRST, _order

UNIT = Path(__file__).resolve().parents[1]


def test_every_long_file_named_exists() -> None:
    """A renamed or removed file would drop out of the order silently."""
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    for name in LONGEST_FIRST:
        assert (E2E / name).is_file(), name


def test_long_end_to_end_files_first_then_the_others_then_unit_files() -> None:
    unit_file = UNIT / "config" / "test_settings.py"
    names = [unit_file, E2E / "test_lint.py", E2E / LONGEST_FIRST[-1],
             E2E / "test_batch_timeout_serve.py", E2E / LONGEST_FIRST[0]]  # fmt: skip
    items = [SimpleNamespace(path=path) for path in names]
    ordered = [item.path for item in sorted(items, key=_order)]  # type: ignore[arg-type]
    assert ordered == [E2E / LONGEST_FIRST[0], E2E / LONGEST_FIRST[-1], E2E / "test_lint.py",
                       E2E / "test_batch_timeout_serve.py", unit_file]  # fmt: skip
