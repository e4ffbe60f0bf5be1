"""The learner's signing key (``weights.keys``): made once, private and logged, or read from the
configured file."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from livefit.server.config.model_tables import WeightsSettings
from livefit.server.config.settings import ConfigError, Settings
from livefit.server.weights.keys import (
    SigningKey,
    default_public_path,
    learner_signing_key,
    parse_verify_key,
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


def test_learner_creates_its_key_once_private_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = tmp_path / "data"
    with caplog.at_level(logging.INFO):
        key = learner_signing_key(WeightsSettings(), storage, "demo")
    assert key.path is not None and stat.S_IMODE(key.path.stat().st_mode) == 0o600
    assert key.public.base64() in caplog.text and str(key.path) in caplog.text
    assert "created in" in caplog.text
    again = learner_signing_key(WeightsSettings(), storage, "demo")
    assert again.key_id == key.key_id
    # A replica sharing the storage dir finds the public key without any setting.
    public = parse_verify_key(default_public_path(storage).read_bytes())
    assert public.key_id == key.key_id
    auth = receiver_authenticator(settings(tmp_path), "demo")
    assert auth.verify_key is not None and auth.verify_key.key_id == key.key_id


def test_configured_signing_key_file(tmp_path: Path, signer: SigningKey) -> None:
    path = tmp_path / "k.pem"
    path.write_bytes(signer.private_pem())
    key = learner_signing_key(WeightsSettings(signing_key_file=str(path)), tmp_path, "demo")
    assert key.key_id == signer.key_id
    assert not (tmp_path / "keys").exists(), "no key is made when one is configured"
    with pytest.raises(ConfigError, match="signing_key_file"):
        learner_signing_key(WeightsSettings(signing_key_file=str(tmp_path / "none")), tmp_path, "m")
