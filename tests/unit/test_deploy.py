"""The docker compose deployment, checked without a Docker engine.

docker-compose.yml, the Dockerfile and everything under deploy/ refer to each other by paths,
service names, ports, user names and metric names; these tests check that every such reference
lands on something real. The broker's ACL is checked on a real mosquitto, and the Prometheus
config and dashboard queries with promtool when it is on PATH (Debian: prometheus).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import yaml
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.reasoncodes import ReasonCode

from livefit.local_servers import LivefitProcess
from livefit.server.config.settings import Settings, load_settings
from livefit.server.mqtt.broker import parse_broker_url
from livefit.server.runtime.local_process import LocalProcess, free_port, quiet_env, wait_listening
from tests.metric_groups import every_family

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
CONFIG = ROOT / "deploy" / "livefit.toml"
MOSQUITTO_CONF = ROOT / "deploy" / "mosquitto" / "mosquitto.conf"
ACL = ROOT / "deploy" / "mosquitto" / "acl"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "livefit.json"
LIVEFIT_COMMANDS = ("serve", "replica")
# Which livefit command each Prometheus job scrapes.
JOB_COMMANDS = {"livefit-learner": "serve", "livefit-replicas": "replica"}
# Compose interpolation: $$ (a literal $), ${VAR}, ${VAR:-default}, ${VAR-default}, $VAR.
_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>\w+)(?:(?P<sep>:?-)(?P<default>[^}]*))?\}|(?P<bare>\w+))"
)


# ---------------------------------------------------------------------------------------------
# Reading the files


@cache
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def interpolate(value: str) -> str:
    """What compose makes of ``value`` with no .env and no variable set: every default."""

    def substitute(match: re.Match[str]) -> str:
        return "$" if match["escaped"] else match["default"] or ""

    return _VARIABLE.sub(substitute, value)


def variables(node: Any) -> Iterator[re.Match[str]]:
    """Every ``${VAR...}`` / ``$VAR`` reference in the compose tree ($$ excluded)."""
    if isinstance(node, dict):
        for child in node.values():
            yield from variables(child)
    elif isinstance(node, list):
        for child in node:
            yield from variables(child)
    elif isinstance(node, str):
        yield from (m for m in _VARIABLE.finditer(node) if not m["escaped"])


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: interpolate(str(value)) for key, value in env.items()}


@dataclass(frozen=True)
class Mount:
    kind: str  # "bind" or "volume"
    source: str | None  # None for an anonymous volume
    target: str

    def host_path(self) -> Path | None:
        """The repo path a bind mount shares; None for a volume."""
        if self.kind != "bind" or self.source is None:
            return None
        return (COMPOSE_FILE.parent / self.source).resolve()


def mounts(service: dict[str, Any]) -> list[Mount]:
    result = []
    for entry in service.get("volumes", []):
        if isinstance(entry, dict):
            result.append(Mount(entry["type"], entry.get("source"), entry["target"]))
            continue
        parts = entry.split(":")
        if len(parts) == 1:
            result.append(Mount("volume", None, parts[0]))
            continue
        kind = "bind" if parts[0].startswith((".", "/", "~")) else "volume"
        result.append(Mount(kind, parts[0], parts[1]))
    return result


def mount_target(service: dict[str, Any], source: Path) -> str:
    """Where ``service`` mounts the repo path ``source``; fails if it does not."""
    for mount in mounts(service):
        if mount.host_path() == source:
            return mount.target
    raise AssertionError(f"{source.relative_to(ROOT)} is not mounted")


def bind_source(service: dict[str, Any], target: str) -> Path:
    for mount in mounts(service):
        path = mount.host_path()
        if path is not None and mount.target == target:
            return path
    raise AssertionError(f"nothing is bind-mounted at {target}")


def port_pairs(service: dict[str, Any]) -> list[tuple[int | None, int]]:
    """(host port or None, container port) for each published port."""
    pairs = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            published = entry.get("published")
            pairs.append((int(published) if published else None, int(entry["target"])))
            continue
        parts = interpolate(str(entry)).split("/")[0].split(":")
        pairs.append((int(parts[-2]) if len(parts) > 1 else None, int(parts[-1])))
    return pairs


def depends_on(service: dict[str, Any]) -> list[str]:
    return list(service.get("depends_on", []))


def livefit_command(service: dict[str, Any]) -> str | None:
    command = service.get("command", [])
    command = shlex.split(command) if isinstance(command, str) else command
    return command[0] if command and command[0] in LIVEFIT_COMMANDS else None


def livefit_services(include_profiles: bool = True) -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in services().items()
        if livefit_command(service) and (include_profiles or not service.get("profiles"))
    }


def stacks() -> dict[str, set[str]]:
    """The services `up` starts: by default, and with each profile (minus what it replaces)."""
    default = {name for name, s in services().items() if not s.get("profiles")}
    result = {"default": default}
    for name, service in services().items():
        for profile in service.get("profiles", []):
            stack = result.setdefault(profile, set(default))
            stack.add(name)
            stack.discard(service.get("x-replaces", ""))
    return result


@cache
def settings() -> Settings:
    return load_settings(CONFIG, environ={})


def mosquitto_conf() -> dict[str, list[str]]:
    options: dict[str, list[str]] = {}
    for line in MOSQUITTO_CONF.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.strip().partition(" ")
            options.setdefault(key, []).append(value.strip())
    return options


def acl_users() -> dict[str, list[tuple[str, str]]]:
    """user -> [(access, topic pattern)] from the mosquitto ACL file."""
    users: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in ACL.read_text().splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "user":
            current = users.setdefault(words[1], [])
        else:
            assert words[0] == "topic" and current is not None, f"unexpected ACL line: {line}"
            current.append((words[1], words[2]) if len(words) == 3 else ("readwrite", words[1]))
    return users


def broker_passwords() -> dict[str, str]:
    """user -> password, as mosquitto-init writes them into the password file (defaults)."""
    init = services()["mosquitto-init"]
    script = "\n".join(init["command"])
    env = environment(init)
    found = re.findall(r'mosquitto_passwd (?:-c )?-b \S+ (\w+) "\$\$(\w+)"', script)
    return {user: env[variable] for user, variable in found}


def panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def expressions() -> list[str]:
    return [target["expr"] for panel in panels() for target in panel["targets"]]


def exported_series() -> set[str]:
    """Every series name a livefit process can expose (family names lack _total and _info)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "info": ("_info",),
    }
    names: set[str] = set()
    metrics = every_family()  # the families of every part some livefit process runs
    for family in metrics.registry.collect():
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


# ---------------------------------------------------------------------------------------------
# Compose file


def test_bind_mounts_exist_and_named_volumes_are_declared() -> None:
    declared = set(compose().get("volumes") or {})
    used = set()
    for name, service in services().items():
        for mount in mounts(service):
            path = mount.host_path()
            if path is not None:
                assert path.exists(), f"{name}: {mount.source} is not in the repo"
            elif mount.source is not None:
                assert mount.source in declared, f"{name}: volume {mount.source} not declared"
                used.add(mount.source)
    assert declared == used, f"declared but unused volumes: {declared - used}"


def test_build_contexts_hold_a_dockerfile_with_the_build_args() -> None:
    for name, service in services().items():
        if "build" not in service:
            continue
        build = service["build"]
        build = {"context": build} if isinstance(build, str) else build
        dockerfile = COMPOSE_FILE.parent / build["context"] / build.get("dockerfile", "Dockerfile")
        assert dockerfile.is_file(), f"{name}: no {dockerfile}"
        declared = set(re.findall(r"^ARG (\w+)", dockerfile.read_text(), re.MULTILINE))
        assert set(build.get("args", {})) <= declared, f"{name}: build args not in {dockerfile}"


def interpolated(node: Any) -> Any:
    """The compose tree as compose validates it: every variable replaced by its default."""
    if isinstance(node, dict):
        return {key: interpolated(value) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolated(value) for value in node]
    return interpolate(node) if isinstance(node, str) else node


def test_compose_file_follows_the_compose_specification() -> None:
    """Against the Compose Specification's JSON schema (vendored in tests/compose-spec.json, with
    its source and version in its ``$comment``; there is no network at test time)."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "tests" / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [
        f"{'/'.join(str(p) for p in error.absolute_path)}: {error.message}"
        for error in validator.iter_errors(interpolated(compose()))
    ]
    assert not errors, errors
    broken = interpolated(compose()) | {"services": {"x": {"image": "a", "ports": [{"x": 1}]}}}
    assert not validator.is_valid(broken)  # the schema does reject what compose rejects


def test_compose_needs_v2_and_says_so() -> None:
    """The top-level ``name`` is Compose v2 only (Debian's docker-compose 1.29 refuses it):
    both READMEs tell users to run ``docker compose``."""
    assert compose()["name"] == "livefit"
    for readme in (ROOT / "README.md", ROOT / "deploy" / "README.md"):
        text = " ".join(readme.read_text().split())
        assert "Compose v2" in text and "docker-compose 1.29" in text, readme


_PINNED = re.compile(r"^[\w./-]+(:[\w.-]*\d+\.\d+\.\d+[\w.-]*)?(@sha256:[0-9a-f]{64})?$")


def test_every_image_is_pinned_to_a_release() -> None:
    """No ``latest`` and no bare major tags (eclipse-mosquitto:2): an `up` next month must pull
    what was tested. Images built here are pinned through their base image."""
    for name, service in services().items():
        if "build" in service:
            args = service["build"].get("args", {})
            assert _PINNED.match(args.get("BASE_IMAGE", "")) and ":" in args["BASE_IMAGE"], name
            continue
        image = service["image"]
        assert ":" in image and _PINNED.match(image), f"{name}: {image} is not pinned"
    default = re.search(r"^ARG BASE_IMAGE=(\S+)", DOCKERFILE.read_text(), re.MULTILINE)
    assert default is not None
    bases = {s["build"]["args"]["BASE_IMAGE"] for s in services().values() if "build" in s}
    assert bases == {default[1]}, "compose and the Dockerfile build on different images"


def test_the_broker_is_published_on_loopback_only_by_default() -> None:
    (entry,) = services()["mosquitto"]["ports"]
    assert interpolate(entry) == "127.0.0.1:1883:1883"
    for match in variables(entry):
        assert match["braced"] in ("LIVEFIT_MQTT_BIND", "LIVEFIT_MQTT_PORT")
    assert "LIVEFIT_MQTT_BIND=0.0.0.0" in (ROOT / "deploy" / "README.md").read_text()


def test_host_ports_do_not_collide() -> None:
    for stack_name, stack in stacks().items():
        seen: dict[int, str] = {}
        for name in sorted(stack):
            for host, _ in port_pairs(services()[name]):
                if host is not None:
                    assert host not in seen, f"{stack_name}: {name} and {seen[host]} use {host}"
                    seen[host] = name


def test_dependencies_exist_and_replacements_name_a_service() -> None:
    for name, service in services().items():
        for dependency in depends_on(service):
            assert dependency in services(), f"{name} depends on unknown {dependency}"
        assert service.get("x-replaces", name) in services()


def test_every_variable_has_a_default_and_is_in_env_example() -> None:
    example = (ROOT / ".env.example").read_text()
    documented = set(re.findall(r"^(\w+)=", example, re.MULTILINE))
    for match in variables(compose()):
        name = match["braced"] or match["bare"]
        assert match["sep"] == ":-", f"${{{name}}} needs a default so a fresh clone starts"
        assert name in documented, f"{name} is missing from .env.example"


def test_livefit_services_listen_where_compose_publishes() -> None:
    port = settings().http.port
    for name, service in livefit_services().items():
        assert port in [target for _, target in port_pairs(service)], f"{name}: no port {port}"


# ---------------------------------------------------------------------------------------------
# livefit configuration and the environment compose gives it


def test_deploy_config_validates() -> None:
    s = settings()
    assert (s.http.host, s.http.port) == ("0.0.0.0", 8000)
    assert s.storage.dir == "/var/lib/livefit"
    assert list(s.models) == ["demo"] and s.models["demo"].builder == "mlp"
    assert s.models["demo"].weights.hmac_key is None, "secrets belong in the environment"
    assert parse_broker_url(s.broker.url).password is None, "secrets belong in the environment"


@pytest.mark.parametrize("name", sorted(livefit_services()))
def test_livefit_environment_maps_to_settings(name: str) -> None:
    service = services()[name]
    assert service["command"][1:] == ["--config", mount_target(service, CONFIG)]
    env = environment(service)
    assert all(key.startswith("LIVEFIT_") for key in env), env
    configured = load_settings(CONFIG, environ=env)  # an unknown key fails validation here
    for key, value in env.items():
        *path, leaf = key.removeprefix("LIVEFIT_").lower().split("__")
        node: Any = configured
        for part in path:
            node = node[part] if isinstance(node, dict) else getattr(node, part)
        got = getattr(node, leaf)
        got = got.get_secret_value() if hasattr(got, "get_secret_value") else got
        assert str(got) == value, f"{key} did not reach {'.'.join([*path, leaf])}"


@pytest.mark.parametrize("name", sorted(livefit_services()))
def test_livefit_services_reach_the_broker_as_a_known_user(name: str) -> None:
    configured = load_settings(CONFIG, environ=environment(services()[name]))
    address = parse_broker_url(configured.broker.url)
    listener = int(mosquitto_conf()["listener"][0].split()[0])
    assert address.host in services() and address.port == listener
    assert address.host in depends_on(services()[name])
    assert address.username in acl_users(), f"{name}: {address.username} not in the ACL"
    assert broker_passwords()[address.username] == address.password


def test_replicas_verify_the_learners_weight_key_and_cannot_sign() -> None:
    """weights-key-init writes the private key into the volume the learners mount where
    signing_key_file points, and the public key into the one the replicas mount where
    verify_key_file points; no replica mounts the private key."""
    script = "\n".join(services()["weights-key-init"]["command"])
    found = re.search(r"python -m livefit\.server\.weights\.keys (\S+) (\S+)", script)
    assert found is not None, script
    private, public = found.groups()
    init = {m.target: m.source for m in mounts(services()["weights-key-init"])}
    private_volume, public_volume = init[os.path.dirname(private)], init[os.path.dirname(public)]
    assert private_volume != public_volume
    for name, service in livefit_services().items():
        weights = load_settings(CONFIG, environ=environment(service)).models["demo"].weights
        volumes = {m.target: m.source for m in mounts(service) if m.kind == "volume"}
        learner = livefit_command(service) == "serve"
        key_file = weights.signing_key_file if learner else weights.verify_key_file
        assert key_file is not None, name
        assert volumes.get(os.path.dirname(key_file)) == (
            private_volume if learner else public_volume
        ), name
        assert os.path.basename(key_file) == os.path.basename(private if learner else public)
        assert learner or private_volume not in volumes.values(), f"{name} could sign"
        assert "weights-key-init" in depends_on(service), name


def test_public_url_points_at_the_learner() -> None:
    host, port = settings().http.base_url().removeprefix("http://").split(":")
    assert livefit_command(services()[host]) == "serve" and int(port) == settings().http.port


# ---------------------------------------------------------------------------------------------
# Dockerfile


def test_dockerfile_copies_every_package_and_nothing_missing() -> None:
    text = DOCKERFILE.read_text()
    sources = [
        source.rstrip("/")
        for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.MULTILINE)
        for source in line.split()[:-1]
    ]
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignored = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the repo"
        assert not any(fnmatch.fnmatch(source, p) for p in ignored), f"{source} is dockerignored"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert set(pyproject["tool"]["setuptools"]["package-dir"].values()) <= set(sources)
    assert pyproject["project"]["readme"] in sources


def test_dockerfile_runs_livefit_as_non_root_on_the_configured_port() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^USER (?!root)\w+", text, re.MULTILINE)
    assert 'ENTRYPOINT ["livefit"]' in text
    assert f"EXPOSE {settings().http.port}" in text
    assert "/v2/health/live" in text
    assert "livefit" in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


# ---------------------------------------------------------------------------------------------
# Prometheus


def test_prometheus_scrapes_every_livefit_service() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    scraped = set()
    for job in config["scrape_configs"]:
        assert job.get("metrics_path", "/metrics") == "/metrics"
        for static in job["static_configs"]:
            for target in static["targets"]:
                host, port = target.split(":")
                assert livefit_command(services()[host]) == JOB_COMMANDS[job["job_name"]], target
                assert int(port) == settings().http.port, target
                scraped.add(host)
    assert scraped == set(livefit_services(include_profiles=False))


def test_prometheus_config_passes_promtool() -> None:
    promtool = _require("promtool")
    result = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    promtool = _require("promtool")
    rules = [
        {"record": f"livefit:dashboard_query_{i}", "expr": expr.replace("$model", ".*")}
        for i, expr in enumerate(expressions())
    ]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _require(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        pytest.skip(f"{program} is not on PATH (apt-get install prometheus provides it)")
    return path


# ---------------------------------------------------------------------------------------------
# Grafana


def test_grafana_provisioning_matches_the_mounts() -> None:
    grafana = services()["grafana"]
    assert bind_source(grafana, "/etc/grafana/provisioning") == GRAFANA / "provisioning"
    provider_file = GRAFANA / "provisioning" / "dashboards" / "livefit.yml"
    providers = yaml.safe_load(provider_file.read_text())["providers"]
    for provider in providers:
        assert bind_source(grafana, provider["options"]["path"]) == DASHBOARD.parent
    home = environment(grafana).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    assert home is None or home == f"{providers[0]['options']['path']}/{DASHBOARD.name}"


def test_grafana_datasource_is_the_prometheus_service() -> None:
    datasource_file = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
    (datasource,) = yaml.safe_load(datasource_file.read_text())["datasources"]
    host, port = datasource["url"].removeprefix("http://").split(":")
    assert (host, int(port)) == ("prometheus", 9090)
    assert 9090 in [target for _, target in port_pairs(services()[host])]
    for panel in panels():
        for node in (panel, *panel["targets"]):
            assert node["datasource"] == {"type": "prometheus", "uid": datasource["uid"]}


def test_dashboard_panels_are_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert dashboard["uid"] and dashboard["schemaVersion"] >= 36
    for panel in panels():
        assert panel["type"] == "timeseries" and panel["targets"], panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]


def test_dashboard_uses_only_metrics_livefit_exports() -> None:
    used = {name for expr in expressions() for name in re.findall(r"livefit_\w+", expr)}
    unknown = used - exported_series()
    assert not unknown, f"not exported by livefit.server.base.metrics: {sorted(unknown)}"
    expected = {"livefit_train_loss", "livefit_prequential_loss", "livefit_serving_version"}
    assert expected <= used


# ---------------------------------------------------------------------------------------------
# mosquitto


def test_mosquitto_is_configured_not_to_lose_messages() -> None:
    options = {key: values[-1] for key, values in mosquitto_conf().items()}
    assert options["persistence"] == "true"
    assert options["autosave_interval"] == "1"
    assert int(options["max_queued_messages"]) >= 100_000
    assert int(options["max_inflight_messages"]) >= settings().broker.receive_maximum
    assert options["persistent_client_expiration"] == "14d"
    assert options["allow_anonymous"] == "false"
    assert options["log_dest"] == "stdout"


def test_mosquitto_files_are_where_compose_puts_them() -> None:
    options = {key: values[-1] for key, values in mosquitto_conf().items()}
    broker = services()["mosquitto"]
    assert mount_target(broker, MOSQUITTO_CONF) == "/mosquitto/config/mosquitto.conf"
    volume_targets = {m.target for m in mounts(broker) if m.kind == "volume"}
    assert options["persistence_location"].rstrip("/") in volume_targets
    for key in ("password_file", "acl_file"):
        assert os.path.dirname(options[key]) in volume_targets, key
    assert set(broker_passwords()) == set(acl_users())
    assert "mosquitto-init" in depends_on(broker)


def test_acl_lets_each_user_do_its_job_and_no_more(tmp_path: Path) -> None:
    if shutil.which("mosquitto") is None or shutil.which("mosquitto_passwd") is None:
        pytest.skip("mosquitto is not on PATH (apt-get install mosquitto)")
    s = settings()
    topics = samples, rejected, weights = (
        s.samples_topic("demo"), s.dead_letter_topic("demo"), s.weights_topic("demo"),
    )  # fmt: skip
    with _deploy_mosquitto(tmp_path) as check:
        assert not check(None, "write", samples), "anonymous clients must be refused"
        for topic in topics:  # retained, so that a permitted subscription receives one at once
            assert check("livefit", "write", topic) and check("livefit", "read", topic)
        assert check("replica", "read", weights)
        assert not check("replica", "write", weights) and not check("replica", "read", samples)
        for topic in (s.predictions_topic("demo"), s.labels_topic("demo")):  # delayed labels
            assert check("replica", "write", topic)
        assert check("publisher", "write", samples) and check("publisher", "read", rejected)
        assert not check("publisher", "write", weights)
        assert not check("publisher", "read", weights)


Check = Callable[[str | None, str, str], bool]


@contextmanager
def _deploy_mosquitto(workdir: Path) -> Iterator[Check]:
    """deploy/mosquitto/mosquitto.conf on a free port, its paths moved under ``workdir``."""
    port = free_port()
    for i, user in enumerate(acl_users()):
        create = ["-c"] if i == 0 else []
        command = ["mosquitto_passwd", *create, "-b", str(workdir / "passwd"), user, f"pw-{user}"]
        subprocess.run(command, check=True, capture_output=True, timeout=10)
    shutil.copy(ACL, workdir / "acl")
    conf = workdir / "mosquitto.conf"
    conf.write_text(_moved_conf(workdir, port))
    with LocalProcess(
        "mosquitto", ["mosquitto", "-c", str(conf)], workdir / "stdout.log"
    ) as broker:
        broker.start()
        try:
            wait_listening("127.0.0.1", port, broker.alive, "mosquitto")
        except RuntimeError as exc:
            raise AssertionError(f"mosquitto refused the config: {exc}\n{broker.tail()}") from None
        yield lambda user, access, topic: _allowed(port, user, access, topic)


def _moved_conf(workdir: Path, port: int) -> str:
    moved = {
        "listener": f"{port} 127.0.0.1",
        "persistence_location": f"{workdir}/",
        "password_file": str(workdir / "passwd"),
        "acl_file": str(workdir / "acl"),
        "log_dest": f"file {workdir / 'mosquitto.log'}",
    }
    lines = []
    for line in MOSQUITTO_CONF.read_text().splitlines():
        key = line.split(" ", 1)[0]
        lines.append(f"{key} {moved[key]}" if key in moved else line)
    if os.geteuid() == 0:
        lines.append("user root")  # mosquitto would otherwise switch to a user without access
    return "\n".join(lines) + "\n"


def _allowed(port: int, user: str | None, access: str, topic: str) -> bool:
    """True when ``user`` may ``write`` (publish, retained) or ``read`` ``topic``."""
    probe = _Probe(port, user)
    try:
        if not probe.connected:
            return False
        return probe.can_write(topic) if access == "write" else probe.can_read(topic)
    finally:
        probe.close()


class _Probe:
    """One MQTT 5 client driven by hand (no thread), recording the broker's answers.

    A denied publish gets a "not authorized" PUBACK. A denied read is a subscription that
    receives nothing: mosquitto may grant the SUBACK and filter each message instead. So a read
    is judged on a retained message, which the broker sends right after the SUBACK, before it
    handles the next packet: a second SUBSCRIBE, whose SUBACK therefore closes the window.
    """

    def __init__(self, port: int, user: str | None) -> None:
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
        if user is not None:
            self.client.username_pw_set(user, f"pw-{user}")
        self.acks: list[ReasonCode] = []
        self.received: list[str] = []
        self.client.on_connect = lambda _c, _u, _f, code, _p: self.acks.append(code)
        self.client.on_publish = lambda _c, _u, _m, code, _p: self.acks.append(code)
        self.client.on_subscribe = lambda _c, _u, _m, codes, _p: self.acks.extend(codes)
        self.client.on_message = lambda _c, _u, message: self.received.append(message.topic)
        self.client.connect("127.0.0.1", port, keepalive=10)
        self.connected = not self._answer(lambda: None).is_failure

    def can_write(self, topic: str) -> bool:
        return not self._answer(lambda: self.client.publish(topic, b"{}", 1, True)).is_failure

    def can_read(self, topic: str) -> bool:
        if self._answer(lambda: self.client.subscribe(topic, qos=1)).is_failure:
            return False
        self._answer(lambda: self.client.subscribe("livefit/probe-fence", qos=1))
        return topic in self.received

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop(0.02)

    def _answer(self, send: Callable[[], object]) -> ReasonCode:
        count = len(self.acks)
        send()
        deadline = time.monotonic() + 10
        while len(self.acks) == count:
            assert time.monotonic() < deadline, "the broker did not answer within 10 s"
            self.client.loop(0.02)
        return self.acks[count]


# ---------------------------------------------------------------------------------------------
# The services run in order, from their own commands (no Docker engine)


def test_compose_services_start_from_their_commands_in_order(tmp_path: Path) -> None:
    """What ``docker compose up`` runs, as this machine can run it: each service's command with
    its environment, each named volume a directory shared by the services that mount it, and
    container paths in commands and configs moved to those directories. Only the broker's
    address, the HTTP ports and the listening address differ from the containers'. mosquitto-init
    and weights-key-init run first; the broker, the learner and a replica then start from
    deploy/ and must get ready (the learner used to exit 3, "cannot read
    .../weights-signing.pub": key-init wrote the public key only where the replicas look)."""
    for program in ("mosquitto", "mosquitto_passwd"):
        if shutil.which(program) is None:
            pytest.skip(f"{program} is not on PATH (apt-get install mosquitto)")
    volumes = {name: tmp_path / "volumes" / name for name in compose()["volumes"]}
    for path in volumes.values():
        path.mkdir(parents=True)
    for name in ("mosquitto-init", "weights-key-init"):
        _run_init(name, volumes, tmp_path)
    port = free_port()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(_service_conf(port, volumes, tmp_path))
    with LocalProcess("mosquitto", ["mosquitto", "-c", str(conf)], tmp_path / "broker.log") as mq:
        mq.start()
        wait_listening("127.0.0.1", port, mq.alive, "mosquitto")
        learner_port = free_port()
        learner = _service_process("learner", volumes, tmp_path, port, learner_port)
        replica = _service_process("replica-1", volumes, tmp_path, port, learner_port)
        with learner, replica:
            learner.start(ready_timeout_s=None)
            replica.start(ready_timeout_s=None)
            learner.wait_ready(180)
            replica.wait_ready(120)


def _container_paths(name: str, volumes: dict[str, Path], workdir: Path) -> dict[str, Path]:
    """Container path -> directory or file here, for service ``name``: its bind mounts, its
    named volumes, and the image's VOLUMEs it does not mount (anonymous volumes)."""
    service = services()[name]
    paths: dict[str, Path] = {}
    if "build" in service:
        declared = re.findall(r"^VOLUME \[(.*)\]$", DOCKERFILE.read_text(), re.MULTILINE)
        for target in (json.loads(f"[{item}]")[0] for item in declared):
            paths[target] = workdir / f"{name}-anonymous{target.replace('/', '-')}"
            paths[target].mkdir(parents=True, exist_ok=True)
    for mount in mounts(service):
        if mount.kind == "bind":
            host = mount.host_path()
            assert host is not None
            paths[mount.target] = host
        else:
            assert mount.source is not None, f"{name}: anonymous volume {mount.target}"
            paths[mount.target] = volumes[mount.source]
    return paths


def _moved(text: str, paths: dict[str, Path]) -> str:
    """``text`` with every container path replaced by its directory here (longest first)."""
    for target in sorted(paths, key=len, reverse=True):
        text = text.replace(target, str(paths[target]))
    return text


def _run_init(name: str, volumes: dict[str, Path], workdir: Path) -> None:
    """A one-shot service's shell script (entrypoint /bin/sh -ec), run here with its env."""
    service = services()[name]
    assert service["entrypoint"] == ["/bin/sh", "-ec"], name
    script = _moved("\n".join(service["command"]), _container_paths(name, volumes, workdir))
    script = interpolate(script)  # as compose hands it over: $$ is a literal $
    if os.geteuid() != 0:
        script = "chown() { :; }\n" + script  # the image runs it as root; here only root may
    env = {**os.environ, **environment(service)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # its python
    done = subprocess.run(
        ["/bin/sh", "-ec", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"


def _service_conf(port: int, volumes: dict[str, Path], workdir: Path) -> str:
    """deploy/mosquitto/mosquitto.conf with the mosquitto service's paths, on ``port``."""
    paths = _container_paths("mosquitto", volumes, workdir)
    lines = []
    for line in _moved(MOSQUITTO_CONF.read_text(), paths).splitlines():
        lines.append(f"listener {port} 127.0.0.1" if line.startswith("listener ") else line)
    if os.geteuid() == 0:
        lines.append("user root")  # the image's mosquitto runs as user 1883, the volumes' owner
    return "\n".join(lines) + "\n"


def _service_process(
    name: str, volumes: dict[str, Path], workdir: Path, broker_port: int, learner_port: int
) -> LivefitProcess:
    """A livefit service: its command, its environment (the broker's host:port moved to the
    test broker), deploy/livefit.toml with its container paths moved; loopback ports."""
    service = services()[name]
    paths = _container_paths(name, volumes, workdir)
    command, config_flag, config_path = service["command"]
    assert config_flag == "--config" and paths[config_path] == CONFIG, name
    config = _moved(CONFIG.read_text(), paths)
    env = {
        key: value.replace("@mosquitto:1883", f"@127.0.0.1:{broker_port}")
        for key, value in environment(service).items()
    }
    env |= {
        "LIVEFIT_HTTP__HOST": "127.0.0.1",  # 0.0.0.0 in the container
        "LIVEFIT_HTTP__PUBLIC_URL": f"http://127.0.0.1:{learner_port}",  # http://learner:8000
    }
    port = learner_port if command == "serve" else free_port()
    return LivefitProcess(
        config, workdir / name, command, name=name, port=port, env=quiet_env(**env)
    )
