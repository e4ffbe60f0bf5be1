"""The brokers' test kit (``tests/brokers.py``): a missing nats-server skips the NATS tests
where a person runs them and fails them on CI, where ``./dev test`` must have installed it."""

from __future__ import annotations

import pytest

from tests import brokers


@pytest.fixture
def no_nats_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(brokers, "find_nats_server", lambda: None)


@pytest.mark.usefixtures("no_nats_server")
def test_missing_nats_server_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y nats-server"):
        brokers.require_nats_server()


@pytest.mark.usefixtures("no_nats_server")
@pytest.mark.parametrize("value", ["true", "1", "yes"])
def test_missing_nats_server_fails_on_ci(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match="on CI it must be there"):
        brokers.require_nats_server()


@pytest.mark.parametrize("value", ["", "0", "false", "False"])
def test_ci_unset_or_false_is_not_ci(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert not brokers.in_ci()
