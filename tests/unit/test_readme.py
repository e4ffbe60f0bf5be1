"""Keep the README true: every setting and metric documented, CI runs the README's test command."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from livefit.server.base.metrics_merge import WORKERS_UNREACHABLE
from livefit.server.config.model import ModelSettings
from livefit.server.config.settings import Settings
from tests.metric_groups import every_family

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def setting_keys(model: type[BaseModel], prefix: str) -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys += setting_keys(annotation, key + ".")
        elif key != "models":
            keys.append(key)
    return keys


def test_every_setting_is_documented() -> None:
    keys = setting_keys(Settings, "") + setting_keys(ModelSettings, "models.<name>.")
    missing = [key for key in keys if f"| `{key}` |" not in README]
    assert not missing, f"README configuration table lacks: {missing}"


def test_every_metric_is_documented() -> None:
    names = set()
    metrics = every_family()  # every family some process exports
    for family in metrics.registry.collect():
        suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
        names.add(family.name + suffix)
    names.add(WORKERS_UNREACHABLE)  # only in a worker group's merged scrape
    documented = set(re.findall(r"\| `(livefit_\w+)", README))
    documented |= set(re.findall(r"`((?:process|python)_\w+)`", README))
    assert names - documented == set(), f"undocumented metrics: {sorted(names - documented)}"
    assert documented - names == set(), (
        f"README names metrics that do not exist: {sorted(documented - names)}"
    )


def test_ci_runs_the_readme_test_command() -> None:
    command = re.search(r"Run the tests.*?```bash\n(.+?)\n```", README, re.S)
    assert command is not None
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert command.group(1).strip() in ci_lines


def quickstart() -> str:
    block = re.search(r"## Quickstart\n.*?```bash\n(.+?)\n```", README, re.S)
    assert block is not None
    return block.group(1)


def test_quickstart_runs_as_root_on_a_fresh_debian() -> None:
    """No sudo (root has none on a fresh Debian), package lists fetched before installing,
    Python's venv module installed (Debian ships it apart), and the demo as the last step."""
    lines = quickstart().splitlines()
    assert not any(re.search(r"\bsudo\b", line) for line in lines), lines
    install = next(line for line in lines if "apt-get install" in line)
    assert install.startswith("apt-get update && apt-get install -y ")
    assert {"python3-venv", "mosquitto", "mosquitto-clients"} <= set(install.split())
    assert lines[-1].startswith(".venv/bin/livefit demo")


def test_the_full_suites_extra_tools_install_with_one_command() -> None:
    """Chromium (dashboard test), promtool and prometheus, openssl: one apt-get line."""
    line = re.search(r"`(apt-get install -y [^`]+)`", README.split("Run the tests")[0])
    assert line is not None
    assert {"mosquitto", "prometheus", "chromium", "openssl"} <= set(line.group(1).split())


def test_commands_table_shows_optional_arguments_as_optional() -> None:
    """``replica --config`` is optional (the bundled example), as the table says."""
    from livefit.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name in ("serve", "replica"):
        config = next(a for a in commands[name]._actions if "--config" in a.option_strings)
        assert not config.required
        assert f"| `livefit {name} [--config FILE] [--host H] [--port N]" in README
