"""MQTT over TLS with client certificates and passwords, against a real mosquitto TLS listener
with a CA generated for the test. Secrets never reach logs or metrics."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from livefit.clients.payloads import encode_samples
from livefit.local_servers import LivefitProcess
from livefit.server.base.metrics import Metrics
from livefit.server.config.broker_urls import parse_broker_url
from livefit.server.config.sections import BrokerSettings
from livefit.server.mqtt.connection import MqttConnection
from livefit.server.runtime.mosquitto import Mosquitto
from tests.configs import learner_config, model

# paho leaves the socket of a refused TLS handshake to the garbage collector (paho/client.py
# reconnect path); that ResourceWarning is paho's, not ours.
pytestmark = pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)
PASSWORD = "tls-pass-word-42"
HMAC_KEY = "weights-hmac-secret-99"


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    d = directory
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=livefit-test-ca",
            "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"))  # fmt: skip
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, extra in (("server", ["-extfile", str(d / "san.cnf")]), ("client", [])):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))  # fmt: skip
        openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.crt"), "-CAkey",
                str(d / "ca.key"), "-CAcreateserial", "-days", "2", "-out", str(d / f"{name}.crt"), *extra)  # fmt: skip
    other = d / "other"
    other.mkdir()
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=other-ca",
            "-keyout", str(other / "ca.key"), "-out", str(other / "ca.crt"))  # fmt: skip
    return {
        n: d / f"{n}" for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")
    } | {"other_ca": other / "ca.crt"}


@pytest.fixture(scope="module")
def tls_broker(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Mosquitto, dict[str, Path]]]:
    directory = tmp_path_factory.mktemp("tls")
    pki = make_pki(directory)
    passwd = directory / "passwd"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwd), "livefit", PASSWORD], check=True)
    passwd.chmod(0o600)
    broker = Mosquitto(
        directory / "broker",
        extra_config=(
            f"cafile {pki['ca.crt']}\ncertfile {pki['server.crt']}\nkeyfile {pki['server.key']}\n"
            f"require_certificate true\npassword_file {passwd}\n"
        ),
    )
    broker.start()
    yield broker, pki
    broker.stop()


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    yield


def connects(broker: Mosquitto, url: str, tls: dict[str, object]) -> bool:
    settings = BrokerSettings.model_validate(
        {"url": url, "tls": tls, "client_id": f"tls-{time.time_ns()}"}
    )
    connection = MqttConnection(parse_broker_url(url), settings, Metrics())
    connection.start()
    try:
        return connection.wait_connected(3.0)
    finally:
        connection.stop()


def test_tls_with_client_certificate_and_password(
    tls_broker: tuple[Mosquitto, dict[str, Path]],
) -> None:
    broker, pki = tls_broker
    good = {
        "ca_file": str(pki["ca.crt"]),
        "cert_file": str(pki["client.crt"]),
        "key_file": str(pki["client.key"]),
    }
    url = f"mqtts://livefit:{PASSWORD}@127.0.0.1:{broker.port}"
    assert connects(broker, url, good)
    assert not connects(broker, f"mqtts://livefit:wrong@127.0.0.1:{broker.port}", good)
    assert not connects(broker, url, {"ca_file": str(pki["ca.crt"])})  # no client certificate
    assert not connects(
        broker, url, {**good, "ca_file": str(pki["other_ca"])}
    )  # server not trusted
    assert not connects(
        broker, f"mqtt://livefit:{PASSWORD}@127.0.0.1:{broker.port}", {}
    )  # plain TCP


def test_learner_trains_over_tls_and_keeps_secrets_out_of_logs(
    tls_broker: tuple[Mosquitto, dict[str, Path]], tmp_path: Path
) -> None:
    broker, pki = tls_broker
    tls_and_token = (
        f'[broker.tls]\nca_file = "{pki["ca.crt"]}"\ncert_file = "{pki["client.crt"]}"\n'
        f'key_file = "{pki["client.key"]}"\n[http]\ntoken = "http-bearer-secret-7"'
    )
    config = learner_config(
        f"mqtts://livefit:{PASSWORD}@127.0.0.1:{broker.port}", tmp_path / "data", "tls-learner",
        model(input_shape=[4], weights=f'hmac_key = "{HMAC_KEY}"'), broker_lines=tls_and_token,
    )  # fmt: skip
    server = LivefitProcess(config, tmp_path).start()
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    client.tls_set(
        ca_certs=str(pki["ca.crt"]), certfile=str(pki["client.crt"]), keyfile=str(pki["client.key"])
    )
    client.username_pw_set("livefit", PASSWORD)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        x = np.random.default_rng(0).normal(size=(100, 4)).astype(np.float32)
        payload = encode_samples(x, x[:, :1], fmt="msgpack", batched=True)
        client.publish("livefit/demo/samples", payload, qos=1).wait_for_publish(10)
        assert server.wait_for_metric("livefit_train_samples_total", 100, model="demo") == 100
        metrics_text = "\n".join(f"{k} {v}" for k, v in server.metrics().items())
    finally:
        client.disconnect()
        client.loop_stop()
        assert server.stop() == 0
    log = server.log.read_text()
    for secret in (PASSWORD, HMAC_KEY, "http-bearer-secret-7"):
        assert secret not in log and secret not in metrics_text
    assert "mqtts://livefit@127.0.0.1" in log  # the address is logged without its password
