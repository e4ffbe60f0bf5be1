"""Configuration: TOML file, environment overrides, and errors that name the bad key."""

from __future__ import annotations

from pathlib import Path

import pytest

from livefit.models import BUILTIN_BUILDERS
from livefit.server import config
from livefit.server.config import ConfigError, load_settings

MINIMAL = """
[models.demo]
input_shape = [8]
output_shape = [1]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "livefit.toml"
    path.write_text(text)
    return path


def test_bundled_example_loads_with_documented_defaults() -> None:
    settings = load_settings(None, environ={})
    demo = settings.models["demo"]
    assert settings.broker.url == "auto"
    assert (settings.http.host, settings.http.port) == ("127.0.0.1", 8000)
    assert demo.builder == "mlp" and demo.train.max_batch_size == 256
    assert settings.samples_topic("demo") == "livefit/demo/samples"
    assert settings.dead_letter_topic("demo") == "livefit/demo/rejected"
    assert settings.weights_topic("demo") == "livefit/demo/weights"


def test_environment_overrides_file(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "[models.demo.train]\nmax_batch_size = 32\n")
    settings = load_settings(
        path,
        environ={
            "LIVEFIT_HTTP__PORT": "9001",
            "LIVEFIT_BROKER__URL": "mqtt://user:secret@broker.example:1884",
            "LIVEFIT_MODELS__DEMO__TRAIN__MAX_BATCH_SIZE": "64",
            "LIVEFIT_MODELS__DEMO__SERVE__ALLOWED_BATCH_SIZES": "[1, 8, 64]",
            "LIVEFIT_CONFIG": "ignored.toml",
            "OTHER": "x",
        },
    )
    assert settings.http.port == 9001
    assert settings.broker.url == "mqtt://user:secret@broker.example:1884"
    assert settings.models["demo"].train.max_batch_size == 64
    assert settings.models["demo"].serve.batch_sizes() == [1, 8, 64]


def test_numeric_env_values_for_string_keys(tmp_path: Path) -> None:
    settings = load_settings(
        write(tmp_path, MINIMAL), environ={"LIVEFIT_MODELS__DEMO__WEIGHTS__HMAC_KEY": "123456"}
    )
    assert settings.models["demo"].weights.key_bytes() == b"123456"
    assert "123456" not in repr(settings)  # secrets never show in reprs or logs


def test_default_serving_batch_sizes_are_powers_of_two() -> None:
    serve = config.ServeSettings(max_batch_size=48)
    assert serve.batch_sizes() == [1, 2, 4, 8, 16, 32, 48]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (MINIMAL + "[models.demo.train]\nmax_batch_size = 0\n", "models.demo.train.max_batch_size"),
        (MINIMAL + "[models.demo.train]\nmax_batchsize = 8\n", "models.demo.train.max_batchsize"),
        (MINIMAL.replace("[8]", "[0]"), "models.demo.input_shape"),
        (MINIMAL + 'builder = "transformer"\n', "models.demo.builder"),
        ('[broker]\nurl = "http://x"\n' + MINIMAL, "broker.url"),
        ("[http]\nport = 70000\n" + MINIMAL, "http.port"),
        ("[models]\n", "models"),
        ("[models.demo]\ninput_shape = [8]\n", "models.demo.output_shape"),
        (MINIMAL + "[models.demo.serve]\nallowed_batch_sizes = [1, 4]\n", "models.demo.serve"),
        (MINIMAL + 'dead_letter_topic = "a/#"\n', "models.demo.dead_letter_topic"),
    ],
)
def test_errors_name_the_bad_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, text), environ={})
    assert f"  {key}:" in str(caught.value)


def test_env_override_errors_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"models\.demo\.learning_rate"):
        load_settings(
            write(tmp_path, MINIMAL), environ={"LIVEFIT_MODELS__DEMO__LEARNING_RATE": "-1"}
        )


def test_missing_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "nope.toml", environ={})
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_settings(write(tmp_path, "[models\n"), environ={})


def test_sparse_categorical_targets_are_scalars(tmp_path: Path) -> None:
    text = MINIMAL.replace("[1]", "[3]") + 'loss = "sparse_categorical_crossentropy"\n'
    assert (
        load_settings(write(tmp_path, text), environ={}).models["demo"].resolved_target_shape()
        == []
    )


def test_builder_names_agree_with_models_package() -> None:
    assert config.BUILTIN_BUILDERS == BUILTIN_BUILDERS


def test_tensorflow_thread_pools_are_applied_before_the_first_op(tmp_path) -> None:
    """``livefit serve`` sizes TensorFlow's pools from ``[tensorflow]`` (a fresh process:
    TensorFlow only accepts this before its first op)."""
    import subprocess
    import sys

    config = tmp_path / "livefit.toml"
    config.write_text(
        "[tensorflow]\nintra_op_threads = 1\ninter_op_threads = 2\n"
        '[models.m]\nbuilder = "linear"\ninput_shape = [2]\noutput_shape = [1]\n'
    )
    code = (
        "import tensorflow as tf\n"
        "from livefit.server.config import load_settings\n"
        "from livefit.server.modeling import configure_tensorflow\n"
        f"configure_tensorflow(load_settings({str(config)!r}, environ={{}}).tensorflow)\n"
        "tf.constant(1.0) + 1.0\n"
        "print(tf.config.threading.get_intra_op_parallelism_threads(),"
        " tf.config.threading.get_inter_op_parallelism_threads())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["1", "2"]
