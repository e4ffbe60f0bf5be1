"""The unit tests mirror the code (docs/testing.md, "Where a test goes"): the tests of
``server/<package>/<module>.py`` are in ``tests/unit/<package>/test_<module>.py`` (a second
file ``test_<module>_<aspect>.py`` where one aspect is big), those of ``models/``, ``clients/``,
``bench/`` and ``livefit/`` in ``tests/unit/models/``, ``tests/unit/clients/``,
``tests/unit/bench/`` and ``tests/unit/livefit/``;
what tests the repository around the code (deploy files, docs, the import layers, the test
kit) is in ``tests/unit/repo/``. Nothing new lands at the top of ``tests/unit/``.

``tests/learning/`` (tests that learn a stream for seconds) mirrors the code the same way, with
no ``repo`` folder: ``tests/learning/<package>/test_<module>.py`` holds the long tests of a
module whose unit tests are in ``tests/unit/<package>/test_<module>.py``."""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).resolve().parents[1]
ROOT = UNIT.parents[1]
LEARNING = ROOT / "tests" / "learning"
# The folders whose modules have their tests mirrored, by their name under tests/unit/.
SOURCES = {
    **{p.name: p for p in (ROOT / "server").iterdir() if (p / "__init__.py").is_file()},
    **{name: ROOT / name for name in ("models", "clients", "bench", "livefit")},
}
REPO = "repo"
WAITING: set[str] = set()  # none left: every unit file is in its package's folder


def unit_folders(tier: Path = UNIT) -> list[Path]:
    return sorted(p for p in tier.rglob("*") if p.is_dir() and p.name != "__pycache__")


def folder_problems(tier: Path, repo: bool = True) -> list[str]:
    """Each folder of ``tier`` that mirrors no package (nor is ``repo``, where allowed) or has
    no ``__init__.py``."""
    problems = []
    for folder in unit_folders(tier):
        first, *rest = folder.relative_to(tier).parts
        if first == REPO and repo:
            pass
        elif first not in SOURCES:
            problems.append(f"{folder}: no package {first} to mirror")
        elif not (SOURCES[first].joinpath(*rest) / "__init__.py").is_file():
            problems.append(f"{folder}: no package {SOURCES[first].joinpath(*rest)} to mirror")
        if not (folder / "__init__.py").is_file():
            problems.append(f"{folder}: needs an __init__.py")
    return problems


def name_problems(tier: Path) -> list[str]:
    """Each test file of ``tier`` not named after a module of the package its folder mirrors."""
    problems = []
    for folder in unit_folders(tier):
        first, *rest = folder.relative_to(tier).parts
        if first not in SOURCES:
            continue
        source = SOURCES[first].joinpath(*rest)
        modules = {p.stem for p in source.glob("*.py") if p.stem != "__init__"}
        for test in sorted(folder.glob("test_*.py")):
            name = test.stem.removeprefix("test_")
            if not any(name == m or name.startswith(f"{m}_") for m in modules):
                problems.append(
                    f"{test}: name it test_<module>.py after the module of "
                    f"{source.relative_to(ROOT)} it tests (test_<module>_<aspect>.py for a big "
                    "aspect)"
                )
    return problems


def test_nothing_new_at_the_top_of_the_unit_tests() -> None:
    top = {p.name for p in UNIT.glob("test_*.py")}
    assert not top - WAITING, f"put these in tests/unit/<package>/: {sorted(top - WAITING)}"
    assert not WAITING - top, f"moved: take them out of WAITING: {sorted(WAITING - top)}"


def test_every_test_folder_mirrors_a_package_and_is_one() -> None:
    problems = folder_problems(UNIT)
    assert not problems, problems


def test_every_test_file_is_named_after_a_module_of_its_package() -> None:
    problems = name_problems(UNIT)
    assert not problems, problems


def test_nothing_at_the_top_of_the_learning_tests() -> None:
    top = sorted(p.name for p in LEARNING.glob("test_*.py"))
    assert not top, f"put these in tests/learning/<package>/: {top}"


def test_every_learning_folder_mirrors_a_package_and_is_one() -> None:
    problems = folder_problems(LEARNING, repo=False)
    assert not problems, problems


def test_every_learning_file_is_named_after_a_module_and_has_its_unit_file() -> None:
    """A module's long tests sit beside its unit tests: the learning file's name is its unit
    file's, whose helpers it imports."""
    problems = name_problems(LEARNING)
    assert not problems, problems
    for test in LEARNING.rglob("test_*.py"):
        unit = UNIT / test.relative_to(LEARNING)
        assert unit.is_file(), f"{test.relative_to(ROOT)}: no {unit.relative_to(ROOT)} beside it"


def test_the_rules_catch_a_file_or_folder_out_of_place(tmp_path: Path) -> None:
    """The learning tree's rules find a planted violation: a folder that mirrors no package,
    a folder without its ``__init__.py``, a ``repo`` folder, a file named after no module."""
    tier = tmp_path / "learning"
    for folder in ("train", "nowhere", "repo", "models"):
        (tier / folder).mkdir(parents=True)
        if folder != "models":
            (tier / folder / "__init__.py").touch()
    (tier / "train" / "test_trainer_long.py").touch()  # named after a module: fine
    (tier / "train" / "test_everything.py").touch()
    problems = folder_problems(tier, repo=False)
    assert problems == [
        f"{tier / 'models'}: needs an __init__.py",
        f"{tier / 'nowhere'}: no package nowhere to mirror",
        f"{tier / 'repo'}: no package repo to mirror",
    ]
    assert folder_problems(tier, repo=True) == problems[:2]  # the unit tests' repo folder
    named = name_problems(tier)
    assert len(named) == 1 and "test_everything.py" in named[0], named
