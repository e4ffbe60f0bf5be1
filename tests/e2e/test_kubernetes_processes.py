"""The Kubernetes manifests run by the real programs, without a cluster: ``kubectl kustomize``
builds deploy/kubernetes as ``kubectl apply -k`` would (every object then validated against
the Kubernetes schemas, and compared with what ``tests/unit/repo/test_kubernetes.py`` reads), and
the pods start from their own containers' arguments, environment and ConfigMaps: the broker
with its init container's password file, both learner shards and a replica, each Secret made
as docs/kubernetes.md makes it. The references between the files are checked in
``tests/unit/repo/test_kubernetes.py``.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from livefit.local_servers import LivefitProcess
from livefit.server.runtime.local_process import LocalProcess, free_port, quiet_env, wait_listening
from tests.unit.repo.test_kubernetes import (
    K8S,
    KUBERNETES_VERSIONS,
    MONITORING,
    SECRET_VALUE,
    SHARDS,
    config_file,
    environment,
    livefit_container,
    manifests,
    one,
    pod_spec,
    workloads,
)

WEIGHT_KEYS = ("weights-signing.key", "weights-signing.pub")


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH (it builds kustomizations: `kubectl kustomize`)")
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]


def _without_hash(name: str, generated: set[str]) -> str:
    """A generated ConfigMap's name less kustomize's hash suffix (``<name>-<10 chars>``)."""
    base = name.rsplit("-", 1)[0]
    return base if base in generated else name


def _unhashed(node: Any, generated: set[str]) -> Any:
    if isinstance(node, dict):
        return {key: _unhashed(value, generated) for key, value in node.items()}
    if isinstance(node, list):
        return [_unhashed(value, generated) for value in node]
    return _without_hash(node, generated) if isinstance(node, str) else node


def test_kustomize_builds_what_the_unit_tests_read_and_kubernetes_accepts() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    built = [*_kustomize(K8S), *_kustomize(MONITORING)]
    generated = {m.name for m in manifests() if m.kind == "ConfigMap"}
    for obj in built:
        if obj["kind"] != "ServiceMonitor":
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(obj, version, strict=True)
        for container in obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):  # fmt: skip
            if container["image"].startswith("livefit"):
                (image,) = yaml.safe_load((K8S / "kustomization.yaml").read_text())["images"]
                assert container["image"] == f"{image['newName']}:{image['newTag']}"
                container["image"] = "livefit"  # as the manifests write it
    read = {(m.kind, m.name): m.obj for m in manifests()}
    got = {(o["kind"], _without_hash(o["metadata"]["name"], generated)): o for o in built}
    assert set(got) == set(read)
    for key, obj in got.items():
        assert _unhashed(obj, generated) == read[key], key


# ---------------------------------------------------------------------------------------------
# The pods, started from their manifests


def _secrets(workdir: Path) -> dict[str, dict[str, str]]:
    """Every Secret the manifests read, made as docs/kubernetes.md says: random broker
    passwords, and one weight-signing key pair per shard from livefit's key tool."""
    made = {
        "livefit-mqtt-passwords": {
            user: secrets.token_hex(12) for user in ("livefit", "replica", "publisher")
        }
    }
    for shard in SHARDS:
        private, public = (workdir / "keys" / shard / name for name in WEIGHT_KEYS)
        done = subprocess.run(
            [sys.executable, "-m", "livefit.server.weights.keys", str(private), str(public)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        made[f"livefit-{shard}-weights-key"] = {p.name: p.read_text() for p in (private, public)}
    return made


def _resolved(value: str, made: dict[str, dict[str, str]]) -> str:
    """An environment value with the Secret placeholders of ``environment`` filled in."""
    for secret, data in made.items():
        for key, content in data.items():
            value = value.replace(SECRET_VALUE.format(secret=secret, key=key), content)
    return value


def _volumes(workload: dict[str, Any], made: dict[str, dict[str, str]], at: Path) -> dict[str, Path]:  # fmt: skip
    """Volume name -> a directory here, for the secret, projected and empty volumes (a PVC
    and a volumeClaimTemplate too: an empty directory), Secret items written as files."""
    paths = {}
    for volume in [*pod_spec(workload).get("volumes", []), *(
        {"name": t["metadata"]["name"], "emptyDir": {}}
        for t in workload["spec"].get("volumeClaimTemplates", [])
    )]:  # fmt: skip
        if "configMap" in volume:
            continue  # see _container_paths
        directory = at / "volumes" / volume["name"]
        directory.mkdir(parents=True)
        paths[volume["name"]] = directory
        sources = [volume["secret"] | {"name": volume["secret"]["secretName"]}] if "secret" in volume else []  # fmt: skip
        sources += [s["secret"] for s in volume.get("projected", {}).get("sources", [])]
        for source in sources:
            for item in source["items"]:
                (directory / item["path"]).write_text(made[source["name"]][item["key"]])
                (directory / item["path"]).chmod(0o400)
    return paths


def _container_paths(
    workload: dict[str, Any], container: dict[str, Any], volumes: dict[str, Path]
) -> dict[str, Path]:
    """Container path -> path here, for every mount (a ConfigMap's: the repository file that
    kustomize's configMapGenerator puts in it)."""
    generated = {m.name: m.source.parent for m in manifests() if m.kind == "ConfigMap"}
    config_maps = {
        v["name"]: v["configMap"]["name"] for v in pod_spec(workload)["volumes"] if "configMap" in v
    }
    paths = {}
    for mount in container.get("volumeMounts", []):
        if mount["name"] in config_maps:
            paths[mount["mountPath"]] = generated[config_maps[mount["name"]]] / mount["subPath"]
        else:
            paths[mount["mountPath"]] = volumes[mount["name"]]
    return paths


def _moved(text: str, paths: dict[str, Path]) -> str:
    """``text`` with every container path replaced by its path here, in one pass (a path here
    may itself start with a container path, such as /tmp)."""
    if not paths:
        return text
    targets = sorted(paths, key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(target) for target in targets))
    return pattern.sub(lambda match: str(paths[match[0]]), text)


# Runs a command with / read-only but for the directories given, as a pod with
# readOnlyRootFilesystem and its volumes (a private mount namespace: nothing outside changes).
_READ_ONLY_ROOT = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do mount --bind "$1" "$1"; shift; n=$((n - 1)); done; '
    'mount -o remount,bind,ro /; exec "$@"'
)


def _can_make_root_read_only() -> bool:
    """True where this test may run commands in a mount namespace of their own (root, and an
    ``unshare`` the kernel allows)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    done = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30)
    return done.returncode == 0


def _on_read_only_root(argv: list[str], writable: list[Path]) -> list[str]:
    return ["unshare", "-m", "sh", "-ec", _READ_ONLY_ROOT, "sh", str(len(writable)),
            *(str(path) for path in writable), *argv]  # fmt: skip


def _writable(container: dict[str, Any], paths: dict[str, Path]) -> list[Path]:
    """The directories here of the container's writable mounts, and /tmp: this test's own
    files are there (every container has a /tmp volume: tests/unit/repo/test_kubernetes.py)."""
    mounts = container["volumeMounts"]
    return [Path("/tmp"), *(paths[m["mountPath"]] for m in mounts if not m.get("readOnly"))]


def _broker(
    made: dict[str, dict[str, str]], workdir: Path, port: int, read_only: bool
) -> LocalProcess:
    """mosquitto as its Deployment runs it: the init container's script with its environment,
    then the server with the ConfigMap's mosquitto.conf; both with their mounts moved here."""
    broker = one("Deployment", "mosquitto")
    volumes = _volumes(broker, made, workdir / "mosquitto")
    (init,) = pod_spec(broker)["initContainers"]
    init_paths = _container_paths(broker, init, volumes)
    script = _moved("\n".join(init["args"]), init_paths)
    env = {k: _resolved(v, made) for k, v in environment(init).items()}
    argv = ["/bin/sh", "-ec", script]
    if read_only:
        argv = _on_read_only_root(argv, _writable(init, init_paths))
    done = subprocess.run(
        argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (server,) = pod_spec(broker)["containers"]
    paths = _container_paths(broker, server, volumes)
    conf_here = paths.pop("/mosquitto/config/mosquitto.conf")
    lines = []
    for line in _moved(conf_here.read_text(), paths).splitlines():
        lines.append(f"listener {port} 127.0.0.1" if line.startswith("listener ") else line)
    if os.geteuid() == 0:
        lines.append("user root")  # the pod runs it as 1883, the volumes' owner
    conf = workdir / "mosquitto.conf"
    conf.write_text("\n".join(lines) + "\n")
    argv = ["mosquitto", "-c", str(conf)]
    if read_only:
        argv = _on_read_only_root(argv, _writable(server, paths))
    return LocalProcess("mosquitto", argv, workdir / "broker.log")


def _pod(
    name: str, made: dict[str, dict[str, str]], workdir: Path, broker_port: int,
    urls: dict[str, str], port: int, read_only: bool,
) -> LivefitProcess:  # fmt: skip
    """A livefit pod: its container's args and environment (Secrets filled in, the broker's
    Service moved to the test broker), its ConfigMap's TOML with the mounts moved to
    directories here and the Services' URLs to loopback ports; with ``read_only``, on a
    read-only root but for its writable mounts."""
    workload = workloads()[name]
    container = livefit_container(workload)
    assert container is not None
    volumes = _volumes(workload, made, workdir / name)
    paths = _container_paths(workload, container, volumes)
    command, flag, config_path = container["args"]
    assert flag == "--config" and paths[config_path] == config_file(workload)
    config = _moved(paths.pop(config_path).read_text(), paths)
    for url, here in urls.items():
        config = config.replace(url, here)
    env = {
        key: _moved(_resolved(value, made), paths).replace(
            "@mosquitto:1883", f"@127.0.0.1:{broker_port}"
        )
        for key, value in environment(container).items()
    }
    env["LIVEFIT_HTTP__HOST"] = "127.0.0.1"  # 0.0.0.0 in the pod
    pod = LivefitProcess(
        config, workdir / name, command, name=name, port=port, env=quiet_env(**env)
    )
    if read_only:
        pod.argv = _on_read_only_root(pod.argv, _writable(container, paths))
    return pod


def test_the_pods_start_from_their_manifests_and_the_replica_follows_both_shards(
    tmp_path: Path,
) -> None:
    """Both shards get ready with their own keys; the replica gets ready only once it holds a
    version of every model, each verified with its own shard's public key (a key mounted at
    the wrong path, a model without its shard or a Secret item the wrong way round fails).
    As root, every process runs as its pod's readOnlyRootFilesystem makes it: the root
    read-only, only its writable volumes not."""
    for program in ("mosquitto", "mosquitto_passwd"):
        if shutil.which(program) is None:
            pytest.skip(f"{program} is not on PATH (apt-get install mosquitto)")
    made = _secrets(tmp_path)
    read_only = _can_make_root_read_only()
    print(f"read-only root filesystem: {'yes' if read_only else 'no (needs root and unshare)'}")
    broker_port = free_port()
    ports = {shard: free_port() for shard in SHARDS}
    urls = {f"http://livefit-{s}:8000": f"http://127.0.0.1:{p}" for s, p in ports.items()}
    with _broker(made, tmp_path, broker_port, read_only) as broker:
        broker.start()
        wait_listening("127.0.0.1", broker_port, broker.alive, "mosquitto")
        shards = [
            _pod(f"livefit-{s}", made, tmp_path, broker_port, urls, ports[s], read_only)
            for s in SHARDS
        ]
        replica = _pod("livefit-replica", made, tmp_path, broker_port, urls, free_port(), read_only)
        with shards[0], shards[1], replica:
            for process in (*shards, replica):
                process.start(ready_timeout_s=None)
            for process in shards:
                process.wait_ready(240)
            replica.wait_ready(180)
