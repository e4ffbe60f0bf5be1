"""Keep README and docs/ true: every setting and metric documented, the settings tables generated
from the models, links that lead somewhere, the own-model example loadable, CI running README's
test command, and the two commands a fresh machine needs."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel

from livefit.server.base.metrics_merge import WORKERS_UNREACHABLE
from livefit.server.config.model import ModelSettings
from livefit.server.config.settings import Settings, load_settings
from livefit.server.wire.formats import FORMATS
from tests.metric_groups import every_family

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
CONFIGURATION = (DOCS / "configuration.md").read_text()
METRICS = (DOCS / "metrics.md").read_text()
OPERATIONS = (DOCS / "operations.md").read_text()
DEV = (ROOT / "dev").read_text()


def gen_config() -> ModuleType:
    """docs/gen_config.py, the script that writes the settings tables."""
    spec = importlib.util.spec_from_file_location("gen_config", DOCS / "gen_config.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_config", module)
    spec.loader.exec_module(module)
    return module


def setting_keys(model: type[BaseModel], prefix: str) -> list[str]:
    """Every key of the settings tree, walked here apart from the generator's own walk."""
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
    missing = [key for key in keys if f"| `{key}` |" not in CONFIGURATION]
    assert not missing, f"docs/configuration.md lacks: {missing}"
    assert sorted(gen_config().keys()) == sorted(keys)


def test_every_setting_has_a_meaning() -> None:
    assert gen_config().problems() == []


def test_the_settings_tables_are_generated_from_the_models() -> None:
    """Every column comes from the models: a default or a description changed in code shows
    here until the file is written again."""
    assert gen_config().rendered(CONFIGURATION) == CONFIGURATION, (
        "docs/configuration.md is out of date: run .venv/bin/python docs/gen_config.py"
    )
    assert "| `models.<name>.train.max_batch_size` | `256` |" in CONFIGURATION
    assert "| `models.<name>.input_shape` | required |" in CONFIGURATION


def test_every_sample_format_is_documented() -> None:
    """docs/mqtt.md's "Samples" names every registered format and each content type it reads
    (a format added to ``server/wire/formats.py`` is documented there, or this fails)."""
    mqtt = (DOCS / "mqtt.md").read_text()
    samples = mqtt[mqtt.index("## Samples") :].split("\n## ", 1)[0]
    for fmt in FORMATS.values():
        assert fmt.name.lower() in samples.lower(), f"docs/mqtt.md, Samples: no {fmt.name}"
        for content_type in (fmt.content_type, *fmt.accepted_types):
            assert f"`{content_type}`" in samples, f"docs/mqtt.md, Samples: no {content_type}"


def test_every_metric_is_documented() -> None:
    names = set()
    metrics = every_family()  # every family some process exports
    for family in metrics.registry.collect():
        suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
        names.add(family.name + suffix)
    names.add(WORKERS_UNREACHABLE)  # only in a worker group's merged scrape
    documented = set(re.findall(r"\| `(livefit_\w+)", METRICS))
    documented |= set(re.findall(r"`((?:process|python)_\w+)`", METRICS))
    assert names - documented == set(), f"undocumented metrics: {sorted(names - documented)}"
    assert documented - names == set(), (
        f"docs/metrics.md names metrics that do not exist: {sorted(documented - names)}"
    )


def two_commands() -> list[str]:
    """The commands of README's "Two commands" block, comments left out."""
    block = re.search(r"## Two commands\n.*?```bash\n(.+?)\n```", README, re.S)
    assert block is not None
    return [line.split("#")[0].strip() for line in block.group(1).splitlines()]


def app_routes(routes: list[Any]) -> Iterator[Any]:
    """Every route of an app, through the routers it includes."""
    for route in routes:
        included = getattr(route, "original_router", None)
        yield from app_routes(included.routes) if included is not None else [route]


def test_every_http_route_is_documented() -> None:
    """``GET /v2/models/{name}/config`` was served and missing from docs/http.md (issue 45):
    every method and path of the learner's and the replica's app is in its table."""
    from livefit.server.http.app import create_app
    from livefit.server.runtime.learner import LearnerRuntime
    from livefit.server.runtime.replica import ReplicaRuntime

    http = (DOCS / "http.md").read_text()
    settings = load_settings(None, environ={})
    missing = set()
    for runtime in (LearnerRuntime(settings), ReplicaRuntime(settings)):
        for route in app_routes(create_app(runtime, None, None).routes):
            if getattr(route.endpoint, "__name__", "") == "_post_only":
                continue  # any other method on :predict: 405
            for method in sorted(set(route.methods or ()) - {"HEAD"}):
                if f"`{method} {route.path}" not in http:
                    missing.add(f"{method} {route.path}")
    assert not missing, f"docs/http.md lacks: {sorted(missing)}"


def test_readme_gives_two_commands_for_a_fresh_machine() -> None:
    assert two_commands() == ["./dev demo", "./dev test"]
    assert os.access(ROOT / "dev", os.X_OK), "dev must be executable"


def test_ci_runs_the_readme_test_command() -> None:
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "./dev test" in two_commands()
    assert [line for line in ci_lines if line and not line.startswith("#")][-1] == "./dev test"


def test_dev_sets_up_a_fresh_debian_as_root() -> None:
    """Package lists fetched before installing, Python's venv module (Debian ships it apart),
    the tools the full suite uses (mosquitto, nats-server, promtool and prometheus, Chromium,
    openssl, wrk for the benchmarks' quick run), sudo only when it needs no password, and then the demo or pytest itself."""
    assert DEV.index("apt-get update") < DEV.index("apt-get install -y")
    assert "apt_missing+=(python3-venv)" in DEV
    packages = {
        word for line in re.findall(r"^\s*need (.+)$", DEV, re.M) for word in line.split()[1:]
    }
    assert {"mosquitto", "mosquitto-clients", "nats-server", "prometheus", "chromium",
            "openssl", "wrk"} <= packages  # fmt: skip
    assert all("sudo -n" in line for line in DEV.splitlines() if re.search(r"\bsudo\b.*true", line))
    assert 'exec .venv/bin/livefit demo "$@"' in DEV
    assert 'exec .venv/bin/python -m pytest "$@"' in DEV


def test_commands_table_shows_optional_arguments_as_optional() -> None:
    """``replica --config`` is optional (the bundled example), as the tables say."""
    from livefit.cli import build_parser

    commands: Any = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name in ("serve", "replica"):
        config = next(a for a in commands[name]._actions if "--config" in a.option_strings)
        assert not config.required
        assert f"| `livefit {name} [--config FILE] [--host H] [--port N]" in OPERATIONS
        assert f"| `livefit {name} [--config FILE]` |" in README


def command_helps() -> dict[str, list[str]]:
    """Every ``livefit`` command's options, each as ``--help`` prints its text."""
    from livefit.cli import build_parser

    commands: Any = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    return {
        name: [" ".join(command._get_formatter()._expand_help(action).split())
               for action in command._actions if action.help]
        for name, command in commands.items()
    }  # fmt: skip


def test_command_help_says_each_default_once_and_never_none() -> None:
    """``livefit demo --help`` printed "(default: a temp dir, deleted on exit) (default:
    None)" (issue 45)."""
    for name, helps in command_helps().items():
        for text in helps:
            assert "(default: None)" not in text and "(default: False)" not in text, (name, text)
            assert text.count("(default") <= 1, (name, text)


def test_command_help_points_at_pages_and_sections_that_exist() -> None:
    """``livefit publish --help`` sent readers to README 'Delayed labels', a section that had
    moved to docs/labels.md (issue 45)."""
    headings = {slug(h) for h in re.findall(r"^#+ (.+)$", README, re.M)}
    for name, helps in command_helps().items():
        for text in helps:
            for section in re.findall(r"README '([^']+)'", text):
                assert slug(section) in headings, (name, text)
            for page, anchor in re.findall(r"(docs/[\w-]+\.md)(?:#([\w-]+))?", text):
                assert (ROOT / page).is_file(), (name, text)
                if anchor:
                    found = re.findall(r"^#+ (.+)$", (ROOT / page).read_text(), re.M)
                    assert anchor in {slug(h) for h in found}, (name, text)


def test_the_own_model_example_waits_only_while_serve_runs() -> None:
    """README's ``until curl ...`` loop never ended when ``serve`` had died (a typo in the
    config): the loop's body checks the process (the loop run for real:
    ``tests/e2e/test_readme_example.py``)."""
    section = README.split("## Your own model")[1].split("\n## ")[0]
    (loop,) = [line for line in section.splitlines() if line.startswith("until curl")]
    assert re.search(r"; do kill -0 \$! [^;]*\|\| break; sleep 1; done", loop), loop


def test_readme_is_a_front_page() -> None:
    assert len(README.splitlines()) < 250
    for doc in DOCS.glob("*.md"):
        assert f"(docs/{doc.name})" in README, f"README does not link docs/{doc.name}"


def test_the_own_model_example_is_a_valid_config(tmp_path: Path) -> None:
    """The TOML the README writes loads, and the CSV, the publish and the curl fit its shapes."""
    section = README.split("## Your own model")[1].split("\n## ")[0]
    toml = re.search(r"printf '(.+?)' > my\.toml", section)
    assert toml is not None
    (tmp_path / "my.toml").write_text(toml.group(1).replace("\\n", "\n"))
    settings = load_settings(tmp_path / "my.toml", environ={})
    ((name, model),) = settings.models.items()
    assert model.input_shape == [3] and model.output_shape == [1]
    assert "np.random.rand(5000, 3)" in section and "x @ [1, -2, 3]" in section
    assert f"livefit publish --model {name} --source my.csv" in section
    request = re.search(rf"/v1/models/{name}:predict -d '(.+?)'", section)
    assert request is not None
    (instance,) = json.loads(request.group(1))["instances"]
    assert len(instance) == model.input_shape[0]


def test_the_fleet_example_configs_load_and_describe_alpha_alike(tmp_path: Path) -> None:
    """docs/fleet.md's learner and replica configs load; the replica describes alpha as its
    learner does (a replica builds what the learner trains) and names a pull URL per model."""
    blocks = re.findall(r"```toml\n(.+?)```", (DOCS / "fleet.md").read_text(), re.S)
    assert len(blocks) == 2
    loaded = []
    for number, block in enumerate(blocks):
        (tmp_path / f"{number}.toml").write_text(block)
        loaded.append(load_settings(tmp_path / f"{number}.toml", environ={}))
    learner, replica = loaded
    assert set(replica.models) == {"alpha", "beta"}
    ignored = {"weights"}
    assert learner.models["alpha"].model_dump(exclude=ignored) == replica.models[
        "alpha"
    ].model_dump(exclude=ignored)
    urls = {name: model.weights.pull_url for name, model in replica.models.items()}
    assert urls["alpha"] == learner.http.public_url and urls["alpha"] != urls["beta"]


def slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(pages: list[Path]) -> list[str]:
    """The relative links of ``pages`` that name no file, or no heading of it."""
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", file.read_text(), re.M)
                if anchor not in {slug(h) for h in headings}:
                    broken.append(f"{page.name}: {target} (no such heading)")
    return broken


def test_links_lead_somewhere() -> None:
    """Every relative link of README and docs/ names a file that exists, and a heading of it."""
    broken = broken_links([ROOT / "README.md", *sorted(DOCS.glob("*.md"))])
    assert not broken, broken
