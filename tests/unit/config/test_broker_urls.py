"""Broker addresses (``config.broker_urls``): ``broker.url`` as one node, a list or a
comma-separated string (absurd inputs included), the shared credentials, and what the settings
refuse when the file loads, passwords never shown."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from livefit.server.config.broker_urls import (
    MAX_BROKER_URLS,
    BrokerAddress,
    parse_broker_url,
    parse_broker_urls,
)
from livefit.server.config.sections import BrokerSettings
from livefit.server.config.settings import ConfigError, load_settings
from tests.configs import learner_config

THREE = "mqtt://10.0.0.1:1883,mqtt://10.0.0.2:1884,mqtt://10.0.0.3"


@pytest.mark.parametrize(
    "value",
    [THREE, THREE.split(","), " mqtt://10.0.0.1:1883 , mqtt://10.0.0.2:1884,mqtt://10.0.0.3 "],
)
def test_the_nodes_in_order_from_a_list_or_a_comma_separated_string(
    value: str | list[str],
) -> None:
    parsed = parse_broker_urls(value)
    assert [(a.host, a.port) for a in parsed] == [
        ("10.0.0.1", 1883), ("10.0.0.2", 1884), ("10.0.0.3", 1883),
    ]  # fmt: skip
    assert BrokerSettings(url=value).urls() == [u.strip() for u in THREE.split(",")]


def test_one_url_is_one_node() -> None:
    assert parse_broker_urls("mqtts://h") == (BrokerAddress("h", 8883, tls=True),)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ([], "no broker URL"),
        ("", "no broker URL"),
        ("mqtt://a:1,,mqtt://b:2", "empty one"),
        ("mqtt://a:1,", "empty one"),
        ([f"mqtt://h:{1 + i}" for i in range(10_000)], "10000 broker URLs: at most 64"),
        ("mqtt://a:1,mqtts://b:2", "mix"),
        ("mqtt://h:\u0661\u0668\u0668\u0663", "invalid port"),  # Arabic-Indic 1883
        ("mqtt://h:\uff11\uff18\uff18\uff13", "invalid port"),  # fullwidth 1883
        ("mqtt://h:99999", "invalid port"),
        ("mqtt://a:1,http://b:2", "mqtt:// or mqtts://"),
        ("mqtt://a:1,mqtt://a:1", "twice"),
        ("mqtt://u:p@a:1,mqtt://v:p@b:2", "different users"),
        ("mqtt://h:0", "port 0"),  # was taken as no port: 1883, perhaps another broker
        ("mqtt://[::1:1", "Invalid IPv6"),
    ],
)
def test_bad_node_lists_are_refused_with_the_reason(value: str | list[str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_broker_urls(value)


@pytest.mark.parametrize(
    "value",
    [[], "mqtt://a:1,,mqtt://b:2", "mqtt://a:1,mqtts://b:2", ["mqtt://h"] * (MAX_BROKER_URLS + 1)],
)
def test_settings_refuse_bad_node_lists(value: str | list[str]) -> None:
    with pytest.raises(ValidationError):
        BrokerSettings(url=value)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("mqtt://a:1,mqtt://A:1", "twice"),
        ("mqtt://h,mqtt://h:1883", "twice"),
        ("mqtt://h:abc", "invalid port"),
        ("mqtt://h:99999", "invalid port"),
        ("mqtt://h:0", "port 0"),
        ("mqtt://u:p@:1883", "must look like"),
        ("mqtt://u:p#q@h:1", "must look like"),
        ("mqtt://u@a:1,mqtt://u:p@b:2", "different users"),
        ("mqtt://[::1:1", "Invalid IPv6"),
    ],
)
def test_the_settings_refuse_what_the_clients_would_refuse_when_the_file_loads(
    tmp_path: Path, value: str, says: str
) -> None:
    """Before, these loaded, and `livefit serve`/`replica` died in startup with a traceback
    (or, for port 0, connected to 1883)."""
    config = tmp_path / "c.toml"
    config.write_text(learner_config("mqtt://x:1", tmp_path / "data", "env-nodes"))
    with pytest.raises(ConfigError, match=says) as refused:
        load_settings(config, environ={"LIVEFIT_BROKER__URL": value})
    assert "LIVEFIT_BROKER__URL" in str(refused.value)


@pytest.mark.parametrize(
    "value",
    [
        "mqtt://replica:Ab3/x+SECRET@mosquitto:1883",  # a base64 password: '/' in it
        "mqtt://a:1,mqtt://u:Ab/SECRET@b:2",
        "mqtt://u:SE,CRET@h:1",  # a comma splits the URL: neither piece may be shown
        "mqtt://u:p@SECRET#x@h:1",
        "mqtt://u:SECRET@h:1\nmqtt://h:2",
    ],
)
def test_a_refused_url_never_shows_its_password(tmp_path: Path, value: str) -> None:
    """Before, a password holding '/' (or a comma) was shown whole in the error, twice."""
    config = tmp_path / "c.toml"
    config.write_text(learner_config("mqtt://x:1", tmp_path / "data", "env-nodes"))
    with pytest.raises(ConfigError) as refused:
        load_settings(config, environ={"LIVEFIT_BROKER__URL": value})
    for secret in ("SECRET", "SE", "CRET", "Ab3", "Ab/"):
        assert secret not in str(refused.value), str(refused.value)


def test_credentials_written_once_apply_to_every_node_and_are_never_shown() -> None:
    parsed = parse_broker_urls("mqtt://a:1,mqtt://learner:s3cret@b:2,mqtt://c:3")
    assert {(a.username, a.password) for a in parsed} == {("learner", "s3cret")}
    assert all("s3cret" not in str(a) for a in parsed)
    with pytest.raises(ValueError) as refused:
        parse_broker_urls("mqtt://a:1,mqtt://learner:s3cret@b:x")
    assert "s3cret" not in str(refused.value)


def test_the_environment_carries_nodes_as_a_comma_separated_string_or_a_toml_list(
    tmp_path: Path,
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(learner_config("mqtt://x:1", tmp_path / "data", "env-nodes"))
    for raw in (THREE, '["mqtt://10.0.0.1:1883", "mqtt://10.0.0.2:1884", "mqtt://10.0.0.3"]'):
        settings = load_settings(config, environ={"LIVEFIT_BROKER__URL": raw})
        assert len(parse_broker_urls(settings.broker.url)) == 3
    with pytest.raises(ConfigError) as refused:
        load_settings(config, environ={"LIVEFIT_BROKER__URL": "mqtt://u:pw@a:1,mqtts://b:2"})
    assert "LIVEFIT_BROKER__URL" in str(refused.value) and "pw" not in str(refused.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mqtt://127.0.0.1:1884", BrokerAddress("127.0.0.1", 1884)),
        ("mqtt://broker", BrokerAddress("broker", 1883)),
        (
            "mqtts://u%40x:p%3Aw@broker.example",
            BrokerAddress("broker.example", 8883, True, "u@x", "p:w"),
        ),
        ("mqtt://[::1]:1999/", BrokerAddress("::1", 1999)),
    ],
)
def test_parse_broker_url(url: str, expected: BrokerAddress) -> None:
    assert parse_broker_url(url) == expected


@pytest.mark.parametrize(
    "url", ["http://host", "127.0.0.1:1883", "mqtt://", "mqtt://h:99999", "mqtt://h/x"]
)
def test_parse_broker_url_rejects(url: str) -> None:
    with pytest.raises(ValueError):
        parse_broker_url(url)


def test_password_never_appears_in_the_address_text() -> None:
    assert str(parse_broker_url("mqtt://me:secret@h:1")) == "mqtt://me@h:1"
