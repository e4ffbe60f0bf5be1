"""The Kubernetes manifests (deploy/kubernetes/), checked without a cluster.

Every object is validated offline against the Kubernetes API's own schemas (kubernetes-validate
bundles them) for the oldest and the newest version named below; the ServiceMonitor, a custom
resource those schemas do not know, against a small JSON schema written here from the
prometheus-operator API reference. Then the wiring: each ConfigMap's TOML must load with
livefit's own settings loader, under the environment its pod gives it, and every reference
between objects and to livefit (ports, probe paths, the CLI, key files, the broker, Services,
selectors, the image) must land on something real. kustomize itself is not run here (unit
tests start no process): the few kustomize features the manifests use (``resources``,
``configMapGenerator``, ``namespace``, ``images``) are read as kustomize reads them, and
``tests/e2e/test_kubernetes_kustomize.py`` runs ``kubectl kustomize`` on the same files.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from livefit.cli import build_parser
from livefit.server.config.broker_urls import parse_broker_url
from livefit.server.config.settings import Settings, load_settings
from livefit.server.http.app import create_app
from livefit.server.runtime.learner_group import TRAINING_GRACE_S
from livefit.server.runtime.workers import STOP_GRACE_S
from tests.stub_runtime import StubRuntime

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "kubernetes"
MONITORING = K8S / "monitoring"
DOCKERFILE = ROOT / "Dockerfile"
# The oldest Kubernetes the manifests promise (docs/kubernetes.md) and the newest that
# kubernetes-validate bundles schemas for; strict: unknown fields are errors, as the API
# server's field validation makes them.
KUBERNETES_VERSIONS = ("1.30", "1.37")
SHARDS = ("shard-a", "shard-b")
WORKLOADS = ("StatefulSet", "Deployment")
# Placeholders for the values pods take from Secrets, so that references can be followed.
SECRET_VALUE = "{secret}{key}"


# ---------------------------------------------------------------------------------------------
# Reading the manifests as kustomize does


@dataclass(frozen=True)
class Manifest:
    """One Kubernetes object and the file it comes from (for a generated ConfigMap: the
    file whose content it holds)."""

    obj: dict[str, Any]
    source: Path

    @property
    def kind(self) -> str:
        return str(self.obj["kind"])

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])


def kustomization(directory: Path) -> dict[str, Any]:
    return yaml.safe_load((directory / "kustomization.yaml").read_text())


def build(directory: Path, namespace: str | None = None) -> list[Manifest]:
    """The objects ``kustomize build directory`` makes, less the hash suffix of generated
    ConfigMap names (kustomize rewrites every reference to them, so they match either way)."""
    spec = kustomization(directory)
    namespace = spec.get("namespace", namespace)
    result: list[Manifest] = []
    for entry in spec.get("resources", []):
        path = directory / entry
        if path.is_dir():
            result += build(path, namespace)
            continue
        for obj in yaml.safe_load_all(path.read_text()):
            if obj:
                result.append(Manifest(obj, path))
    for generator in spec.get("configMapGenerator", []):
        files = [directory / name for name in generator["files"]]
        obj = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": generator["name"]},
            "data": {file.name: file.read_text() for file in files},
        }
        result += [Manifest(obj, file) for file in files[:1]]
    for manifest in result:
        if namespace and manifest.kind != "Namespace":
            manifest.obj["metadata"]["namespace"] = namespace
    return result


@cache
def manifests() -> tuple[Manifest, ...]:
    """Every object: ``kubectl apply -k deploy/kubernetes`` and its monitoring/."""
    return (*build(K8S), *build(MONITORING))


def objects(kind: str) -> dict[str, dict[str, Any]]:
    return {m.name: m.obj for m in manifests() if m.kind == kind}


def one(kind: str, name: str) -> dict[str, Any]:
    return objects(kind)[name]


def workloads() -> dict[str, dict[str, Any]]:
    return {name: obj for kind in WORKLOADS for name, obj in objects(kind).items()}


def livefit_workloads() -> dict[str, dict[str, Any]]:
    return {name: obj for name, obj in workloads().items() if livefit_container(obj) is not None}


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(workload)
    return [*spec.get("initContainers", []), *spec["containers"]]


def livefit_container(workload: dict[str, Any]) -> dict[str, Any] | None:
    found = [c for c in pod_spec(workload)["containers"] if c["image"] == "livefit"]
    return found[0] if found else None


def command(workload: dict[str, Any]) -> str:
    container = livefit_container(workload)
    assert container is not None
    return str(container["args"][0])


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def volume(workload: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [v for v in pod_spec(workload).get("volumes", []) if v["name"] == name]
    return found


def mount_of(container: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The volume mount that holds ``path`` (a file in a mounted directory, or a subPath)."""
    for mount in container.get("volumeMounts", []):
        target = mount["mountPath"].rstrip("/")
        if path == target or path.startswith(target + "/"):
            return mount
    return None


def environment(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet makes it: Secret values as placeholders
    (``SECRET_VALUE``), ``$(VAR)`` replaced by the variables defined before it."""
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "valueFrom" in entry:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = SECRET_VALUE.format(secret=ref["name"], key=ref["key"])
            continue
        env[entry["name"]] = re.sub(
            r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), str(entry["value"])
        )
    return env


def config_file(workload: dict[str, Any]) -> Path:
    """The repository file the workload's livefit reads as ``--config``, through its ConfigMap."""
    container = livefit_container(workload)
    assert container is not None
    parsed = build_parser().parse_args(container["args"])
    mount = mount_of(container, parsed.config)
    assert mount is not None, f"--config {parsed.config} is not mounted"
    config_map = volume(workload, mount["name"])["configMap"]["name"]
    key = mount.get("subPath") or parsed.config.removeprefix(mount["mountPath"]).lstrip("/")
    (source,) = [m.source for m in manifests() if m.kind == "ConfigMap" and m.name == config_map]
    assert source.name == key, f"{config_map} has no key {key}"
    return source


def settings(name: str) -> Settings:
    """The livefit configuration workload ``name`` runs with: its ConfigMap's TOML under its
    container's environment (an unknown key, a bad value or a bad override fails here)."""
    workload = workloads()[name]
    container = livefit_container(workload)
    assert container is not None
    return load_settings(config_file(workload), environ=environment(container))


def shard_workload(shard: str) -> dict[str, Any]:
    return one("StatefulSet", f"livefit-{shard}")


@cache
def app_paths() -> set[str]:
    """The paths livefit's HTTP app answers GET on (learner and replica build the same app)."""
    paths = create_app(StubRuntime()).openapi()["paths"]
    return {path for path, methods in paths.items() if "get" in methods}


# ---------------------------------------------------------------------------------------------
# The objects are valid Kubernetes


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_follows_the_kubernetes_schema(version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    errors = []
    for manifest in manifests():
        if manifest.kind == "ServiceMonitor":
            continue  # a custom resource: test_servicemonitor_follows_the_operator_api
        try:
            kubernetes_validate.validate(manifest.obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            errors.append(f"{manifest.source}: {manifest.kind}/{manifest.name}: {path}: {error}")
    assert not errors, "\n".join(errors)


def test_the_schema_check_does_reject_what_the_api_server_rejects() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    statefulset = shard_workload(SHARDS[0])
    broken_spec = {**statefulset["spec"], "replica": 1}  # a typo the API server refuses
    for broken in (
        {**statefulset, "spec": broken_spec},
        {**statefulset, "spec": {**statefulset["spec"], "replicas": "one"}},
    ):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


_DURATION = (
    "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array"},
    },
}
# The ServiceMonitor fields these manifests use, as the prometheus-operator API reference
# (https://prometheus-operator.dev/docs/api-reference/api/#monitoring.coreos.com/v1.ServiceMonitor)
# defines them: spec.selector is required, endpoints[].port names a Service port, durations
# are Prometheus durations. Any other field is refused here, so one added to the manifest must
# be added to this schema from that reference first.
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector"],
            "properties": {
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "endpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": _DURATION},
                        },
                    },
                },
            },
        },
    },
}


def test_servicemonitor_follows_the_operator_api() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft7Validator(SERVICE_MONITOR_SCHEMA)
    monitors = objects("ServiceMonitor")
    assert monitors, "no ServiceMonitor"
    for name, monitor in monitors.items():
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(monitor)]
        assert not errors, f"{name}: {errors}"
        broken = {**monitor, "spec": {**monitor["spec"], "endpoints": [{"interval": "15 s"}]}}
        assert not validator.is_valid(broken)
        for endpoint in monitor["spec"]["endpoints"]:
            timeout, interval = endpoint["scrapeTimeout"], endpoint["interval"]
            assert int(timeout.removesuffix("s")) <= int(interval.removesuffix("s"))


def test_every_file_is_in_a_kustomization() -> None:
    listed = set()
    for directory in {K8S, *(p.parent for p in K8S.rglob("kustomization.yaml"))}:
        spec = kustomization(directory)
        for entry in spec.get("resources", []):
            assert (directory / entry).exists(), f"{directory}: {entry} does not exist"
            listed.add((directory / entry).resolve())
        for generator in spec.get("configMapGenerator", []):
            listed |= {(directory / f).resolve() for f in generator["files"]}
    for path in K8S.rglob("*"):
        if path.is_file() and path.name != "kustomization.yaml":
            assert path.resolve() in listed, f"{path} is in no kustomization"
    sub_kustomizations = {p.parent for p in K8S.rglob("kustomization.yaml")} - {K8S}
    reached = {(K8S / entry).resolve() for entry in kustomization(K8S)["resources"]}
    assert sub_kustomizations - reached == {MONITORING}, "monitoring/ is applied on its own"


def test_object_names_are_unique_and_in_one_namespace() -> None:
    seen = set()
    for manifest in manifests():
        key = (manifest.kind, manifest.name)
        assert key not in seen, f"two {key}"
        seen.add(key)
        if manifest.kind != "Namespace":
            assert manifest.obj["metadata"]["namespace"] == "livefit", key
    assert "livefit" in objects("Namespace")


# ---------------------------------------------------------------------------------------------
# livefit's own settings, CLI, routes and image


@pytest.mark.parametrize("name", ["livefit-shard-a", "livefit-shard-b", "livefit-replica"])
def test_config_map_is_a_valid_livefit_config(name: str) -> None:
    configured = settings(name)
    raw = tomllib.loads(config_file(workloads()[name]).read_text())
    assert parse_broker_url(raw["broker"]["url"]).password is None, "secrets belong in Secrets"
    assert configured.storage.dir == "/var/lib/livefit"
    assert (configured.http.host, configured.http.port) == ("0.0.0.0", 8000)


def test_the_workloads_are_the_shards_and_the_replicas() -> None:
    assert set(livefit_workloads()) == {*(f"livefit-{s}" for s in SHARDS), "livefit-replica"}
    for shard in SHARDS:
        statefulset = shard_workload(shard)
        assert statefulset["spec"]["replicas"] == 1, "one learner per shard"
        assert command(statefulset) == "serve"
        assert pod_labels(statefulset)["app.kubernetes.io/instance"] == shard
    assert command(one("Deployment", "livefit-replica")) == "replica"


@pytest.mark.parametrize("name", ["livefit-shard-a", "livefit-shard-b", "livefit-replica"])
def test_container_runs_the_images_livefit_on_the_configured_port(name: str) -> None:
    workload = workloads()[name]
    container = livefit_container(workload)
    assert container is not None
    assert "command" not in container, "keep the image's ENTRYPOINT (livefit)"
    assert 'ENTRYPOINT ["livefit"]' in DOCKERFILE.read_text()
    parsed = build_parser().parse_args(container["args"])  # exits on an unknown option
    assert container["args"][0] in ("serve", "replica") and parsed.config
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": settings(name).http.port}


def test_the_image_is_the_dockerfiles_at_livefits_version() -> None:
    (image,) = kustomization(K8S)["images"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert (image["name"], image["newTag"]) == ("livefit", version)
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    broker_image = compose["services"]["mosquitto"]["image"]
    for workload in workloads().values():
        for container in containers(workload):
            assert container["image"] in ("livefit", broker_image), container["image"]


@pytest.mark.parametrize("name", ["livefit-shard-a", "livefit-shard-b", "livefit-replica"])
def test_probes_ask_livefits_health_routes(name: str) -> None:
    container = livefit_container(workloads()[name])
    assert container is not None
    paths = app_paths()
    expected = {
        "startupProbe": "/v2/health/live",
        "livenessProbe": "/v2/health/live",
        "readinessProbe": "/v2/health/ready",
    }
    for probe, path in expected.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path and path in paths, f"{probe}: {get['path']}"
        assert get["port"] in [p["name"] for p in container["ports"]], probe
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, "TensorFlow starts"


def test_grace_periods_cover_livefits_drain() -> None:
    for shard in SHARDS:
        grace = pod_spec(shard_workload(shard))["terminationGracePeriodSeconds"]
        assert grace > TRAINING_GRACE_S + STOP_GRACE_S, shard
    replica = one("Deployment", "livefit-replica")
    container = livefit_container(replica)
    assert container is not None
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod_spec(replica)["terminationGracePeriodSeconds"] > pause + STOP_GRACE_S


def test_pods_run_unprivileged_with_limits() -> None:
    uid = re.search(r"useradd .*--uid (\d+)", DOCKERFILE.read_text())
    assert uid is not None
    for name, workload in workloads().items():
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["automountServiceAccountToken"] is False, name
        if name in livefit_workloads():
            assert spec["securityContext"]["runAsUser"] == int(uid[1]), name
        for container in containers(workload):
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["readOnlyRootFilesystem"] is True, name
            # tmpfile(3), Python's tempfile, mosquitto_passwd: programs expect a writable /tmp
            tmp = mount_of(container, "/tmp")
            assert tmp is not None and tmp["mountPath"] == "/tmp", f"{name}: no /tmp volume"
            assert not tmp.get("readOnly"), name
            assert security["capabilities"] == {"drop": ["ALL"]}, name
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][bound]), name


@pytest.mark.parametrize("name", ["livefit-shard-a", "livefit-shard-b", "livefit-replica"])
def test_what_livefit_writes_is_on_a_volume(name: str) -> None:
    """With a read-only root filesystem, storage.dir and TMPDIR (a split learner's group
    directory) must be writable volumes."""
    container = livefit_container(workloads()[name])
    assert container is not None
    for path in (settings(name).storage.dir, environment(container)["TMPDIR"]):
        mount = mount_of(container, path)
        assert mount is not None and not mount.get("readOnly"), f"{path} is not writable"


# ---------------------------------------------------------------------------------------------
# Shards: one learner per model, each with its own key


def test_each_model_has_exactly_one_learner_and_every_replica_serves_it() -> None:
    owners: dict[str, str] = {}
    for shard in SHARDS:
        for model in settings(f"livefit-{shard}").models:
            assert model not in owners, f"{model}: learned by {owners[model]} and {shard}"
            owners[model] = shard
    replica = settings("livefit-replica")
    assert set(replica.models) == set(owners)
    for model, shard in owners.items():
        learner = settings(f"livefit-{shard}").models[model]
        served = replica.models[model]
        assert served.model_dump(exclude={"weights"}) == learner.model_dump(exclude={"weights"})


def test_shards_use_their_own_mqtt_sessions() -> None:
    ids = [settings(f"livefit-{shard}").broker.client_id for shard in SHARDS]
    ids.append(settings("livefit-replica").broker.client_id)
    assert len(set(ids)) == len(ids), ids


def test_shards_differ_only_by_name_and_models() -> None:
    """Adding a shard is copying a directory and renaming it: nothing else may differ."""
    first = K8S / SHARDS[0]
    for shard in SHARDS[1:]:
        for path in sorted(first.iterdir()):
            if path.name == "livefit.toml":
                continue
            expected = path.read_text().replace(SHARDS[0], shard)
            assert (K8S / shard / path.name).read_text() == expected, f"{shard}/{path.name}"
        assert sorted(p.name for p in (K8S / shard).iterdir()) == sorted(
            p.name for p in first.iterdir()
        )
    listed = kustomization(K8S)["resources"]
    assert all(shard in listed for shard in SHARDS)


def secret_items(source: dict[str, Any]) -> dict[str, str]:
    """Path in the volume -> key in the Secret, for a secret volume or projection."""
    return {item["path"]: item["key"] for item in source["items"]}


@pytest.mark.parametrize("shard", SHARDS)
def test_learner_key_files_are_its_secrets_keys(shard: str) -> None:
    """signing_key_file and verify_key_file land on the shard's own Secret, mounted at their
    directory with the file names as items."""
    statefulset = shard_workload(shard)
    container = livefit_container(statefulset)
    assert container is not None
    for model in settings(f"livefit-{shard}").models.values():
        signing, verify = model.weights.signing_key_file, model.weights.verify_key_file
        assert signing is not None and verify is not None
        for key_file, secret_key in ((signing, "weights-signing.key"), (verify, "weights-signing.pub")):  # fmt: skip
            mount = mount_of(container, key_file)
            assert mount is not None and mount["readOnly"], key_file
            secret = volume(statefulset, mount["name"])["secret"]
            assert secret["secretName"] == f"livefit-{shard}-weights-key"
            relative = key_file.removeprefix(mount["mountPath"]).lstrip("/")
            assert secret_items(secret).get(relative) == secret_key, key_file
        assert volume(statefulset, mount["name"])["secret"]["defaultMode"] == 0o400


def test_replicas_verify_each_shards_key_and_cannot_sign() -> None:
    replica = one("Deployment", "livefit-replica")
    container = livefit_container(replica)
    assert container is not None
    for model, served in settings("livefit-replica").models.items():
        (shard,) = [s for s in SHARDS if model in settings(f"livefit-{s}").models]
        assert served.weights.signing_key_file is None
        key_file = served.weights.verify_key_file
        assert key_file is not None, model
        mount = mount_of(container, key_file)
        assert mount is not None, key_file
        relative = key_file.removeprefix(mount["mountPath"]).lstrip("/")
        sources = [s["secret"] for s in volume(replica, mount["name"])["projected"]["sources"]]
        (source,) = [s for s in sources if relative in secret_items(s)]
        assert source["name"] == f"livefit-{shard}-weights-key", model
        assert secret_items(source)[relative] == "weights-signing.pub", model
    for vol in pod_spec(replica)["volumes"]:
        for source in [vol.get("secret")] + [s.get("secret") for s in vol.get("projected", {}).get("sources", [])]:  # fmt: skip
            if source is not None:
                assert set(secret_items(source).values()) == {"weights-signing.pub"}, vol


def services_of(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in objects("Service").items()
        if selects(service["spec"]["selector"], pod_labels(workload))
    }


def test_public_and_pull_urls_are_the_shards_http_services() -> None:
    replica = settings("livefit-replica")
    for shard in SHARDS:
        configured = settings(f"livefit-{shard}")
        host, port = configured.http.base_url().removeprefix("http://").split(":")
        service = services_of(shard_workload(shard))[host]
        assert service["spec"].get("clusterIP") != "None", f"{host} is headless"
        (service_port,) = [p for p in service["spec"]["ports"] if p["port"] == int(port)]
        assert service_port["targetPort"] == "http"
        for model in configured.models:
            assert replica.models[model].weights.pull_url == configured.http.base_url()


@pytest.mark.parametrize("shard", SHARDS)
def test_statefulset_has_its_headless_service_and_volume(shard: str) -> None:
    statefulset = shard_workload(shard)
    service = one("Service", statefulset["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert selects(service["spec"]["selector"], pod_labels(statefulset))
    container = livefit_container(statefulset)
    assert container is not None
    mount = mount_of(container, settings(f"livefit-{shard}").storage.dir)
    assert mount is not None
    (template,) = statefulset["spec"]["volumeClaimTemplates"]
    assert template["metadata"]["name"] == mount["name"], "storage.dir is not the claim"


# ---------------------------------------------------------------------------------------------
# Services, selectors, autoscaling, monitoring


def test_every_service_selects_pods_on_a_named_port() -> None:
    for name, service in objects("Service").items():
        matched = [w for w in workloads().values() if selects(service["spec"]["selector"], pod_labels(w))]  # fmt: skip
        assert len(matched) == 1, f"{name} selects {len(matched)} workloads"
        ports = {p["name"] for c in containers(matched[0]) for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, f"{name}: {port['targetPort']}"


def test_workload_selectors_match_their_own_pods_only() -> None:
    for name, workload in workloads().items():
        selector = workload["spec"]["selector"]["matchLabels"]
        matched = [n for n, w in workloads().items() if selects(selector, pod_labels(w))]
        assert matched == [name], f"{name} selects {matched}"


def test_autoscaler_and_disruption_budget_hold_the_replicas() -> None:
    deployment = one("Deployment", "livefit-replica")
    (hpa,) = objects("HorizontalPodAutoscaler").values()
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        deployment["apiVersion"], "Deployment", "livefit-replica",
    )  # fmt: skip
    assert "replicas" not in deployment["spec"], "the autoscaler owns the count"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    container = livefit_container(deployment)
    assert container is not None and container["resources"]["requests"]["cpu"]
    (pdb,) = objects("PodDisruptionBudget").values()
    selector = pdb["spec"]["selector"]["matchLabels"]
    assert [n for n, w in workloads().items() if selects(selector, pod_labels(w))] == [
        "livefit-replica"
    ]
    assert hpa["spec"]["minReplicas"] > pdb["spec"]["minAvailable"] >= 1


def test_servicemonitor_scrapes_each_learner_and_the_replicas_once() -> None:
    (monitor,) = objects("ServiceMonitor").values()
    selector = monitor["spec"]["selector"]["matchLabels"]
    scraped = {
        name: service
        for name, service in objects("Service").items()
        if selects(selector, service["metadata"].get("labels", {}))
    }
    expected = {*(f"livefit-{shard}" for shard in SHARDS), "livefit-replica"}
    assert set(scraped) == expected, "each livefit pod behind exactly one scraped Service"
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["path"] == "/metrics" and endpoint["path"] in app_paths()
        for name, service in scraped.items():
            assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]], name
    for name, service in scraped.items():
        labels = service["metadata"]["labels"]
        assert monitor["spec"]["jobLabel"] in labels, name
    assert monitor["metadata"]["namespace"] == one("Namespace", "livefit")["metadata"]["name"]


# ---------------------------------------------------------------------------------------------
# The broker


def mosquitto_options(path: Path) -> dict[str, list[str]]:
    options: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            options.setdefault(key, []).append(value.strip())
    return options


def test_the_brokers_files_are_composes() -> None:
    ours, compose = K8S / "mosquitto", ROOT / "deploy" / "mosquitto"
    assert mosquitto_options(ours / "mosquitto.conf") == mosquitto_options(
        compose / "mosquitto.conf"
    )
    assert (ours / "acl").read_text() == (compose / "acl").read_text()


def test_the_broker_finds_its_files_where_it_mounts_them() -> None:
    broker = one("Deployment", "mosquitto")
    (server,) = pod_spec(broker)["containers"]
    options = {k: v[-1] for k, v in mosquitto_options(K8S / "mosquitto" / "mosquitto.conf").items()}
    config = mount_of(server, "/mosquitto/config/mosquitto.conf")
    assert config is not None and config["subPath"] == "mosquitto.conf"
    data = mount_of(server, options["persistence_location"].rstrip("/"))
    assert data is not None
    assert volume(broker, data["name"])["persistentVolumeClaim"]["claimName"] in objects(
        "PersistentVolumeClaim"
    )
    (init,) = pod_spec(broker)["initContainers"]
    for key in ("password_file", "acl_file"):
        server_mount, init_mount = mount_of(server, options[key]), mount_of(init, options[key])
        assert server_mount is not None and init_mount is not None, key
        assert server_mount["name"] == init_mount["name"], key
    assert broker["spec"]["replicas"] == 1 and broker["spec"]["strategy"]["type"] == "Recreate"


def acl_users() -> set[str]:
    acl = (K8S / "mosquitto" / "acl").read_text()
    return set(re.findall(r"^user (\S+)", acl, re.MULTILINE))


def broker_passwords() -> dict[str, str]:
    """User -> the password the init container gives it (a Secret placeholder)."""
    (init,) = pod_spec(one("Deployment", "mosquitto"))["initContainers"]
    script = "\n".join(init["args"])
    env = environment(init)
    found = re.findall(r'mosquitto_passwd (?:-c )?-b \S+ (\S+) "\$(\w+)"', script)
    return {user: env[variable] for user, variable in found}


@pytest.mark.parametrize("name", ["livefit-shard-a", "livefit-shard-b", "livefit-replica"])
def test_livefit_reaches_the_broker_service_as_a_known_user(name: str) -> None:
    address = parse_broker_url(settings(name).broker.url)
    raw = tomllib.loads(config_file(workloads()[name]).read_text())
    assert parse_broker_url(raw["broker"]["url"]).host == address.host, "file and env disagree"
    service = one("Service", address.host)
    assert address.port in [p["port"] for p in service["spec"]["ports"]]
    assert address.username in acl_users()
    assert broker_passwords()[address.username] == address.password, "not the broker's password"
    expected_user = "livefit" if command(workloads()[name]) == "serve" else "replica"
    assert address.username == expected_user


def test_every_broker_user_has_a_password_and_an_acl() -> None:
    assert set(broker_passwords()) == acl_users()


# ---------------------------------------------------------------------------------------------
# Documentation


def test_docs_walk_the_deployment_and_are_linked() -> None:
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    for step in (
        "docker build", "python -m livefit.server.weights.keys", "create secret generic",
        "kubectl apply -k deploy/kubernetes", "kubectl apply -k deploy/kubernetes/monitoring",
        "/v2/health/ready", "patch hpa livefit-replica", "rollout restart",
    ):  # fmt: skip
        assert step in doc, step
    # The Secrets every pod reads, made by the doc's commands (one per shard in a loop).
    assert f"for shard in {' '.join(SHARDS)}; do" in doc
    made = {"livefit-mqtt-passwords", *(f"livefit-{s}-weights-key" for s in SHARDS)}
    assert "create secret generic livefit-$shard-weights-key" in doc
    assert "create secret generic livefit-mqtt-passwords" in doc
    read = set()
    for workload in workloads().values():
        for container in containers(workload):
            for entry in container.get("env", []):
                read.add(entry.get("valueFrom", {}).get("secretKeyRef", {}).get("name"))
        for vol in pod_spec(workload).get("volumes", []):
            read.add(vol.get("secret", {}).get("secretName"))
            read |= {s["secret"]["name"] for s in vol.get("projected", {}).get("sources", [])}
    assert read - {None} == made
    for version in KUBERNETES_VERSIONS[:1]:
        assert f"Kubernetes {version}" in doc
    assert "docs/kubernetes.md" in (ROOT / "README.md").read_text()
    assert "../docs/kubernetes.md" in (ROOT / "deploy" / "README.md").read_text()
