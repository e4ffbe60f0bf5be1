"""The unit tests mirror the code (docs/testing.md, "Where a test goes"): the tests of
``server/<package>/<module>.py`` are in ``tests/unit/<package>/test_<module>.py`` (a second
file ``test_<module>_<aspect>.py`` where one aspect is big), those of ``models/``, ``clients/``
and ``bench/`` in ``tests/unit/models/``, ``tests/unit/clients/`` and ``tests/unit/bench/``;
what tests the repository around the code (deploy files, docs, the import layers, the test
kit) is in ``tests/unit/repo/``. Nothing new lands at the top of ``tests/unit/``."""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).resolve().parents[1]
ROOT = UNIT.parents[1]
# The folders whose modules have their tests mirrored, by their name under tests/unit/.
SOURCES = {
    **{p.name: p for p in (ROOT / "server").iterdir() if (p / "__init__.py").is_file()},
    **{name: ROOT / name for name in ("models", "clients", "bench")},
}
REPO = "repo"
WAITING: set[str] = set()  # none left: every unit file is in its package's folder


def unit_folders() -> list[Path]:
    return sorted(p for p in UNIT.rglob("*") if p.is_dir() and p.name != "__pycache__")


def test_nothing_new_at_the_top_of_the_unit_tests() -> None:
    top = {p.name for p in UNIT.glob("test_*.py")}
    assert not top - WAITING, f"put these in tests/unit/<package>/: {sorted(top - WAITING)}"
    assert not WAITING - top, f"moved: take them out of WAITING: {sorted(WAITING - top)}"


def test_every_test_folder_mirrors_a_package_and_is_one() -> None:
    for folder in unit_folders():
        first, *rest = folder.relative_to(UNIT).parts
        assert first == REPO or first in SOURCES, f"{folder}: no package {first} to mirror"
        if first != REPO:
            source = SOURCES[first].joinpath(*rest)
            assert (source / "__init__.py").is_file(), f"{folder}: no package {source} to mirror"
        assert (folder / "__init__.py").is_file(), f"{folder} needs an __init__.py"


def test_every_test_file_is_named_after_a_module_of_its_package() -> None:
    for folder in unit_folders():
        first, *rest = folder.relative_to(UNIT).parts
        if first == REPO:
            continue
        source = SOURCES[first].joinpath(*rest)
        modules = {p.stem for p in source.glob("*.py") if p.stem != "__init__"}
        for test in folder.glob("test_*.py"):
            name = test.stem.removeprefix("test_")
            assert any(name == m or name.startswith(f"{m}_") for m in modules), (
                f"{test.relative_to(ROOT)}: name it test_<module>.py after the module of "
                f"{source.relative_to(ROOT)} it tests (test_<module>_<aspect>.py for a big aspect)"
            )
