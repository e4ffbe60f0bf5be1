"""``tests/forkserver.py`` without a process: which launches it forks (a group's parent never,
an environment read while importing only when it matches) and the warnings it sets up (how a
forked child's status reaches its ``Popen``: ``tests/unit/runtime/test_fork_server.py``). Forked
children themselves are checked against fresh ones in ``tests/e2e/test_forkserver.py``."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from tests import forkserver
from tests.configs import learner_config
from tests.layouts import with_workers


def config(workers: int) -> str:
    return with_workers(learner_config("mqtt://127.0.0.1:1883", "data", "forkserver"), workers)


@pytest.mark.parametrize(
    ("command", "workers", "extra", "supervises"),
    [
        ("serve", 0, [], False),  # one-process learner: runs its models
        ("serve", 2, [], True),  # split learner's parent
        ("serve", 2, ["--workers", "0"], False),
        ("replica", 1, [], False),
        ("replica", 3, [], True),  # a worker group's parent
        ("publish", 2, [], False),
    ],
)
def test_a_groups_parent_is_started_fresh(
    tmp_path: Path, command: str, workers: int, extra: list[str], supervises: bool
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(config(workers))
    args = [command, "--config", str(path), *extra]
    assert forkserver.supervises_only(args, {}) is supervises


def test_an_unreadable_config_is_forked_to_say_what_is_wrong(tmp_path: Path) -> None:
    assert not forkserver.supervises_only(["serve", "--config", str(tmp_path / "none")], {})
    assert not forkserver.supervises_only(["serve", "--config"], {})
    env = {"LIVEFIT_HTTP__WORKERS": "2"}  # the environment's settings count
    (tmp_path / "c.toml").write_text(config(0))
    assert forkserver.supervises_only(["serve", "--config", str(tmp_path / "c.toml")], env)


def test_only_the_variables_read_while_importing_are_compared() -> None:
    picked = forkserver.import_time_env(
        {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": "x", "LIVEFIT_HTTP__PORT": "1", "TMPDIR": "/t",
         "PYTHONWARNINGS": "ignore"}
    )  # fmt: skip
    assert picked == {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": "x"}  # warnings set up after
    module_filter = {"PYTHONWARNINGS": "ignore::DeprecationWarning:keras"}
    assert forkserver.import_time_env(module_filter) == module_filter  # these start fresh


def test_pythonwarnings_actions_are_applied_as_python_applies_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "warnoptions", [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forkserver.warn_as_python_would({"PYTHONWARNINGS": "default, ignore"})
        warnings.warn("dropped", UserWarning, stacklevel=1)
        assert sys.warnoptions == ["default", "ignore"]
        assert warnings.filters[0][0] == "ignore"  # the last option first, as Python puts it
    assert not caught
