"""The docker compose deployment, checked without a Docker engine.

docker-compose.yml, the Dockerfile and everything under deploy/ refer to each other by paths,
service names, ports, user names and metric names; these tests check that every such reference
lands on something real. The files run by the real programs (promtool, mosquitto with the
ACL, the services' own commands): ``tests/e2e/test_deploy_processes.py``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from livefit.server.config.broker_urls import parse_broker_url
from livefit.server.config.settings import Settings, load_settings
from tests.metric_groups import every_family

ROOT = Path(__file__).resolve().parents[3]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
CONFIG = ROOT / "deploy" / "livefit.toml"
MOSQUITTO_CONF = ROOT / "deploy" / "mosquitto" / "mosquitto.conf"
ACL = ROOT / "deploy" / "mosquitto" / "acl"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
HAPROXY = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
HAPROXY_REFUSAL = ROOT / "deploy" / "haproxy" / "429.http"
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
def haproxy_sections() -> dict[str, list[list[str]]]:
    """HAProxy's configuration: each section ("global", "backend servers", ...) with its
    lines, split into words, comments left out."""
    sections: dict[str, list[list[str]]] = {}
    current: list[list[str]] = []
    for raw in HAPROXY.read_text().splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        words = shlex.split(line)
        if not raw[0].isspace():
            current = sections.setdefault(" ".join(words), [])
        else:
            current.append(words)
    return sections


def haproxy_lines(section: str, keyword: str) -> list[list[str]]:
    """The lines of ``section`` that start with ``keyword`` (which may be several words)."""
    head = keyword.split()
    return [w for w in haproxy_sections()[section] if w[: len(head)] == head]


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
# HAProxy in front


def test_front_sends_predictions_to_every_livefit_server_while_it_is_ready() -> None:
    """Every livefit service `up` starts by default is a server of the front's backend, by its
    service name and the port it listens on, with a bounded number of requests in flight
    (``maxconn``) and a health check on the readiness route."""
    (backend,) = [name for name in haproxy_sections() if name.startswith("backend ")]
    servers = {words[1]: words[2] for words in haproxy_lines(backend, "server")}
    expected = sorted(livefit_services(include_profiles=False))
    assert sorted(servers) == expected
    for name, address in servers.items():
        assert address == f"{name}:{settings().http.port}", name
    assert ["option", "httpchk", "GET", "/v2/health/ready"] in haproxy_sections()[backend]
    (defaults,) = haproxy_lines(backend, "default-server")
    assert "check" in defaults
    assert int(defaults[defaults.index("maxconn") + 1]) > 0
    _, backend_name = backend.split()
    frontend = next(name for name in haproxy_sections() if name.startswith("frontend "))
    assert haproxy_lines(frontend, "default_backend") == [["default_backend", backend_name]]


def test_front_refuses_with_429_and_retry_after() -> None:
    """A request that waits ``timeout queue`` for a server gets HAProxy's 503, which the
    errorfile (mounted where the configuration reads it) turns into a well-formed 429 with
    Retry-After; a long queue is refused at once the same way."""
    ((_, _, queue_timeout),) = haproxy_lines("defaults", "timeout queue")
    match = re.fullmatch(r"(\d+)(ms|s)", queue_timeout)
    assert match, queue_timeout
    assert 0 < int(match[1]) * (1 if match[2] == "ms" else 1000) <= 1000, "over a second"
    ((_, _, path),) = haproxy_lines("defaults", "errorfile 503")
    # relative to the configuration's own directory, in a checkout as in the container
    assert ["default-path", "config"] in haproxy_sections()["global"]
    assert HAPROXY.parent / path == HAPROXY_REFUSAL
    front = services()["front"]
    assert mount_target(front, HAPROXY_REFUSAL) == str(
        Path(mount_target(front, HAPROXY)).parent / path
    )
    head, _, body = HAPROXY_REFUSAL.read_bytes().partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 429 Too Many Requests"
    fields = dict(line.lower().split(b": ", 1) for line in lines[1:])
    assert int(fields[b"content-length"]) == len(body) and json.loads(body)["error"]
    assert int(fields[b"retry-after"]) >= 1
    frontend = next(name for name in haproxy_sections() if name.startswith("frontend "))
    (refuse,) = haproxy_lines(frontend, "http-request return")
    assert refuse[refuse.index("status") + 1] == "429"
    assert refuse[refuse.index("hdr") + 1] == "retry-after"


def test_front_config_is_mounted_and_published_where_it_binds() -> None:
    front = services()["front"]
    assert mount_target(front, HAPROXY) == "/usr/local/etc/haproxy/haproxy.cfg"
    frontend = next(name for name in haproxy_sections() if name.startswith("frontend "))
    ((_, address),) = haproxy_lines(frontend, "bind")
    assert [target for _, target in port_pairs(front)] == [int(address.rsplit(":", 1)[1])]


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
