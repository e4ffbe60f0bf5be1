"""Keep the README true: every setting and metric documented, CI runs the README's test command."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from livefit.server.config import ModelSettings, Settings
from livefit.server.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent
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
    for family in Metrics().registry.collect():
        suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
        names.add(family.name + suffix)
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
