"""How a replica learns which weights to trust (``weights.receiver_auth``): the verify key in every
form, the wait for a learner starting beside it, and the loud warning of ``allow_unsigned``."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from livefit.server.config.model_tables import WeightsSettings
from livefit.server.config.settings import ConfigError, Settings
from livefit.server.weights.keys import (
    SigningKey,
    default_key_path,
    default_public_path,
    ensure_signing_key,
)
from livefit.server.weights.receiver_auth import receiver_authenticator


@pytest.fixture(scope="module")
def signer() -> SigningKey:
    return SigningKey.generate()


def settings(tmp_path: Path, **weights: object) -> Settings:
    return Settings.model_validate({
        "storage": {"dir": str(tmp_path / "data")},
        "models": {"demo": {"input_shape": [8], "output_shape": [1], "weights": weights}},
    })  # fmt: skip


def test_a_replica_without_a_key_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        receiver_authenticator(settings(tmp_path), "demo")
    message = str(error.value)
    for needed in ("models.demo.weights.verify_key", "verify_key_file", "allow_unsigned = true"):
        assert needed in message


def test_a_replica_waits_briefly_for_a_learner_starting_beside_it(tmp_path: Path) -> None:
    learner_keys: list[SigningKey] = []

    def learner_starts() -> None:  # the learner's own code path, which writes atomically
        time.sleep(0.5)
        data = tmp_path / "data"
        learner_keys.append(
            ensure_signing_key(default_key_path(data), default_public_path(data))[0]
        )

    thread = threading.Thread(target=learner_starts)
    thread.start()
    try:
        auth = receiver_authenticator(settings(tmp_path), "demo", wait_s=20)
    finally:
        thread.join()
    assert auth.verify_key is not None and auth.verify_key.key_id == learner_keys[0].key_id
    started = time.monotonic()
    with pytest.raises(ConfigError):
        receiver_authenticator(settings(tmp_path / "other"), "demo", wait_s=0.3)
    assert 0.3 <= time.monotonic() - started < 5


def test_allow_unsigned_warns_loudly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        auth = receiver_authenticator(settings(tmp_path, allow_unsigned=True), "demo")
    assert auth.verify_key is None and auth.allow_unsigned
    assert "NOT AUTHENTICATED" in caplog.text and "livefit/demo/weights" in caplog.text


def test_verify_key_in_every_form(tmp_path: Path, signer: SigningKey) -> None:
    key_id = signer.key_id
    forms = [signer.public.base64(), signer.public.pem().decode(), signer.public.raw.hex()]
    for form in forms:
        auth = receiver_authenticator(settings(tmp_path, verify_key=form), "demo")
        assert auth.verify_key is not None and auth.verify_key.key_id == key_id
    file = tmp_path / "learner.pub"
    file.write_bytes(signer.public.pem())
    auth = receiver_authenticator(settings(tmp_path, verify_key_file=str(file)), "demo")
    assert auth.verify_key is not None and auth.verify_key.key_id == key_id
    with pytest.raises(ConfigError, match="verify_key"):
        receiver_authenticator(settings(tmp_path, verify_key="not a key"), "demo")
    with pytest.raises(ConfigError, match="cannot read"):
        receiver_authenticator(settings(tmp_path, verify_key_file=str(tmp_path / "no")), "demo")
    with pytest.raises(ValueError, match="not both"):
        WeightsSettings(verify_key=forms[0], verify_key_file=str(file))
