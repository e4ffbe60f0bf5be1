"""The docker compose deployment's files run by the real programs, without a Docker engine:
the Prometheus config and the dashboard's queries through promtool (Debian: prometheus), the
broker's ACL on a real mosquitto, and the compose services started from their own commands
in order. The references between the files: ``tests/unit/repo/test_deploy.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
import yaml
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.reasoncodes import ReasonCode

from livefit.local_servers import LivefitProcess
from livefit.server.runtime.local_process import LocalProcess, free_port, quiet_env, wait_listening
from tests.unit.repo.test_deploy import (
    ACL,
    CONFIG,
    DOCKERFILE,
    MOSQUITTO_CONF,
    PROMETHEUS,
    acl_users,
    compose,
    environment,
    expressions,
    interpolate,
    mounts,
    services,
    settings,
)


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
