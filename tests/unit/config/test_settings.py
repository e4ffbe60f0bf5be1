"""Configuration: TOML file, environment overrides, and errors that name the bad key (as a
user meets them in ``livefit serve``: ``tests/e2e/test_config_at_start.py``)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

from livefit.models.names import BUILTIN_BUILDERS
from livefit.server.config import settings as config
from livefit.server.config.model import ModelSettings
from livefit.server.config.model_tables import ServeSettings
from livefit.server.config.settings import ConfigError, Settings, load_settings
from tests.configs import learner_config

MINIMAL = """
[models.demo]
input_shape = [8]
output_shape = [1]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "livefit.toml"
    path.write_text(text)
    return path


def test_worker_timeout_is_off_or_a_few_heartbeats(tmp_path: Path) -> None:
    for value in (0, 3, 30):
        text = f"[http]\nworker_timeout_s = {value}\n" + MINIMAL
        assert load_settings(write(tmp_path, text), environ={}).http.worker_timeout_s == value


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
    serve = ServeSettings(max_batch_size=48)
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
        ("[http]\nworker_timeout_s = 0.5\n" + MINIMAL, "http.worker_timeout_s"),  # < 3 beats
        ("[models]\n", "models"),
        ("[models.demo]\ninput_shape = [8]\n", "models.demo.output_shape"),
        (MINIMAL + "[models.demo.serve]\nallowed_batch_sizes = [1, 4]\n", "models.demo.serve"),
        (MINIMAL + 'dead_letter_topic = "a/#"\n', "models.demo.dead_letter_topic"),
    ],
)
def test_errors_name_the_bad_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, text), environ={})
    assert f"{key}: " in str(caught.value)
    assert str(caught.value).startswith(f"invalid configuration ({tmp_path / 'livefit.toml'})")


def test_env_override_errors_name_the_variable_not_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(
            write(tmp_path, MINIMAL), environ={"LIVEFIT_MODELS__DEMO__LEARNING_RATE": "-1"}
        )
    assert str(caught.value) == (
        "invalid configuration: LIVEFIT_MODELS__DEMO__LEARNING_RATE=-1: "
        "models.demo.learning_rate: Input should be greater than 0"
    )
    with pytest.raises(ConfigError) as caught:  # the bundled file, as `livefit serve` reads it
        load_settings(None, environ={"LIVEFIT_MODELS__DEMO__TRAIN__MAX_BATCH_SIZE": "0"})
    assert str(caught.value).startswith(
        "invalid configuration: LIVEFIT_MODELS__DEMO__TRAIN__MAX_BATCH_SIZE=0: "
        "models.demo.train.max_batch_size: "
    )
    assert "demo.toml" not in str(caught.value)


def test_env_errors_hide_secrets(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(
            write(tmp_path, MINIMAL),
            environ={
                "LIVEFIT_BROKER__URL": "http://user:hunter2@host",
                "LIVEFIT_HTTP__TOKEN": "[1]",
            },
        )
    message = str(caught.value)
    assert "LIVEFIT_BROKER__URL=http://***@host: broker.url" in message
    assert "LIVEFIT_HTTP__TOKEN=***: http.token" in message
    assert "hunter2" not in message


def test_a_pull_token_that_cannot_be_a_bearer_token_is_refused_unshown(tmp_path: Path) -> None:
    """Per model (a replica following learners whose tokens differ); a token with a space
    would fail only at the first pull, as an httpx error; the value never appears."""
    settings = load_settings(
        write(tmp_path, MINIMAL),
        environ={"LIVEFIT_MODELS__DEMO__WEIGHTS__PULL_TOKEN": "learner-2-token"},
    )
    assert settings.models["demo"].weights.pull_token_bytes() == b"learner-2-token"
    with pytest.raises(ConfigError) as caught:
        load_settings(
            write(tmp_path, MINIMAL),
            environ={"LIVEFIT_MODELS__DEMO__WEIGHTS__PULL_TOKEN": "hunter2 secret"},
        )
    message = str(caught.value)
    assert (
        "LIVEFIT_MODELS__DEMO__WEIGHTS__PULL_TOKEN=***: models.demo.weights.pull_token: "
        "must be a bearer token" in message
    )
    assert "hunter2" not in message


@pytest.mark.parametrize(
    ("line", "key", "suggestion"),
    [
        ('loss = "mse_typo"', "models.demo.loss", "did you mean 'mse'"),
        ('loss = "binary_crossentropie"', "models.demo.loss", "'binary_crossentropy'"),
        ('optimizer = "adma"', "models.demo.optimizer", "'adam'"),
        ('optimizer = "nadamm"', "models.demo.optimizer", "'nadam'"),
        ('builder_options = {activation = "rleu"}', "models.demo.builder_options", "'relu'"),
        (
            'builder_options = {output_activation = "sigmod"}',
            "models.demo.builder_options",
            "'sigmoid'",
        ),
        ("builder_options = {hidden_unit = [8]}", "models.demo.builder_options", "'hidden_units'"),
        ('metrics = ["acuracy"]', "models.demo.metrics", "did you mean 'accuracy'"),
        ('builder = "tests.custom_bulder:build"', "models.demo.builder", "'custom_builder'"),
        ('builder = "no_such_package.models:build"', "models.demo.builder", "on the Python path"),
    ],
)
def test_names_keras_resolves_are_checked_at_load(
    tmp_path: Path, line: str, key: str, suggestion: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, MINIMAL + line + "\n"), environ={})
    message = str(caught.value)
    assert f"{key}: unknown " in message and suggestion in message
    assert "\n" not in message and "Value error" not in message


def test_valid_keras_names_pass(tmp_path: Path) -> None:
    text = MINIMAL + (
        'loss = "MeanSquaredError"\noptimizer = "SGD"\n'
        'builder_options = {activation = "relu", output_activation = "sigmoid"}\n'
    )
    settings = load_settings(write(tmp_path, text), environ={}).models["demo"]
    assert (settings.loss, settings.optimizer) == ("MeanSquaredError", "SGD")
    custom = MINIMAL + 'builder = "tests.custom_builder:build"\nbuilder_options = {anything = 1}\n'
    assert load_settings(write(tmp_path, custom), environ={}).models["demo"].builder_options


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
    assert BUILTIN_BUILDERS == BUILTIN_BUILDERS


def test_bundled_example_shows_the_real_defaults() -> None:
    """Every value the example writes out is the default it would get anyway (nadam at 0.01,
    not the adam at 0.001 it once showed), so editing it starts from what livefit does."""
    import tomllib

    example = tomllib.loads(config.bundled_example_path().read_text())
    model = example["models"]["demo"]
    defaults = ModelSettings(input_shape=[8], output_shape=[1])
    for key, value in model.items():
        if key in ("input_shape", "output_shape", "train"):
            continue
        if key == "topic":
            assert value == "livefit/demo/samples"
            continue
        assert getattr(defaults, key) == value, key
    for key, value in model["train"].items():
        assert getattr(defaults.train, key) == value, key
    for section in ("broker", "http", "storage"):
        section_defaults = Settings.model_fields[section].default.model_dump()
        for key, value in example[section].items():
            assert section_defaults[key] == value, f"{section}.{key}"


TWO_MODELS = MINIMAL + "[models.other]\ninput_shape = [2]\noutput_shape = [1]\n"


@pytest.mark.parametrize(
    ("text", "key", "topic_filter", "consumed"),
    [
        (MINIMAL + 'topic = "livefit/demo/#"\n', "models.demo.topic", "livefit/demo/#",
         "livefit/demo/weights"),
        (MINIMAL + 'topic = "#"\n', "models.demo.topic", "#", "livefit/demo/weights"),
        (MINIMAL + 'topic = "+/+/rejected"\n', "models.demo.topic", "+/+/rejected",
         "livefit/demo/rejected"),
        (MINIMAL + 'topic = "livefit/demo/predictions"\n', "models.demo.topic",
         "livefit/demo/predictions", "livefit/demo/predictions"),
        (TWO_MODELS + 'topic = "livefit/+/events"\n', "models.other.topic", "livefit/+/events",
         "livefit/demo/events"),
        (MINIMAL + "[models.demo.labels]\ntopic = 'livefit/demo/weights'\n",
         "models.demo.labels.topic", "livefit/demo/weights", "livefit/demo/weights"),
        # (a wildcard there, 'in/+', is refused before: replicas publish on that topic)
        (MINIMAL + "[models.demo.weights]\ntopic = 'in/demo'\n[models.demo.labels]\n"
         "predictions_topic = 'in/demo'\n", "models.demo.labels.predictions_topic", "in/demo",
         "in/demo"),
    ],
)  # fmt: skip
def test_a_data_topic_that_matches_what_livefit_publishes_is_refused(
    tmp_path: Path, text: str, key: str, topic_filter: str, consumed: str
) -> None:
    """A learner must not read its own output: ``topic = "livefit/loop/#"`` made one consume
    its retained weights and dead-letter reports, each rejection publishing another report
    (outside attack, issue 26). The error names the setting, its filter and the topic."""
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, text), environ={})
    message = str(caught.value)
    assert message.startswith(f"invalid configuration ({tmp_path / 'livefit.toml'}): {key} ")
    assert f"{topic_filter!r} would consume {consumed!r}" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "lines",
    [
        'topic = "livefit/demo/samples/#"',
        'topic = "sensors/+/demo"',
        'topic = "+/demo/samples"',
        'topic = "#"\ndead_letter_topic = "$app/rejected"\n'
        "[models.demo.weights]\ntopic = '$app/weights'\n[models.demo.drift]\n"
        "events_topic = '$app/events'\n[models.demo.labels]\ntopic = '$app/labels'\n"
        "predictions_topic = '$app/predictions'",  # '#' does not match '$' topics
    ],
)
def test_data_topics_beside_livefits_own_are_accepted(tmp_path: Path, lines: str) -> None:
    text = MINIMAL + lines + "\n"
    assert load_settings(write(tmp_path, text), environ={}).models["demo"]
    shared = TWO_MODELS.replace("[2]", "[2]\ntopic = 'livefit/demo/samples'")  # one stream, two
    assert len(load_settings(write(tmp_path, shared), environ={}).models) == 2


def test_a_malformed_topic_filter_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, MINIMAL + 'topic = "livefit/#/samples"\n'), environ={})
    assert "models.demo.topic: 'livefit/#/samples' is not an MQTT topic filter" in str(caught.value)


# Config holes an outside attack on issue 26 found: each loaded, then failed at every publish
# (a wildcard in a topic livefit publishes on), at the broker (a topic over MQTT's 65,535 UTF-8
# bytes), or clipped every target (target_outlier_std = 1e-300, true, inf). Refused at load,
# naming the key.
PUBLISHED_TOPICS = {
    "models.demo.weights.topic": "[models.demo.weights]\ntopic = '{topic}'",
    "models.demo.dead_letter_topic": "dead_letter_topic = '{topic}'",
    "models.demo.drift.events_topic": "[models.demo.drift]\nevents_topic = '{topic}'",
    "models.demo.labels.topic": "[models.demo.labels]\ntopic = '{topic}'",
    "models.demo.labels.predictions_topic": "[models.demo.labels]\npredictions_topic = '{topic}'",
}


@pytest.mark.parametrize("key", PUBLISHED_TOPICS)
@pytest.mark.parametrize("topic", ["out/+/weights", "out/#", "out/a+b"])
def test_a_topic_livefit_publishes_on_has_no_wildcards(
    tmp_path: Path, key: str, topic: str
) -> None:
    text = MINIMAL + PUBLISHED_TOPICS[key].format(topic=topic) + "\n"
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, text), environ={})
    message = str(caught.value)
    assert f"{key}: {topic!r} is not an MQTT topic to publish on: wildcards" in message
    assert "\n" not in message


@pytest.mark.parametrize("key", [*PUBLISHED_TOPICS, "models.demo.topic"])
def test_a_topic_over_mqtts_65535_utf8_bytes_is_refused(tmp_path: Path, key: str) -> None:
    lines = PUBLISHED_TOPICS.get(key, "topic = '{topic}'")
    longest = "t/" + "é" * 32766 + "x"  # 65,535 bytes in UTF-8 (32,769 characters)
    assert load_settings(write(tmp_path, MINIMAL + lines.format(topic=longest) + "\n"), environ={})
    too_long = longest + "x"
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, MINIMAL + lines.format(topic=too_long) + "\n"), environ={})
    message = str(caught.value)
    assert f"{key}: " in message and "65536 UTF-8 bytes, over MQTT's 65535" in message
    assert len(message) < 500  # the topic itself is not repeated whole


REFUSED_CHARACTERS = ["\0", "\t", "\n", "\x1b", "\x7f", "\x85", "\x9f", "\ufdd0", "\uffff",
                      "\U0010fffe"]  # fmt: skip


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string, every character outside printable ASCII escaped."""
    escaped = "".join(c if " " <= c <= "~" and c not in '"\\' else f"\\U{ord(c):08X}" for c in text)
    return f'"{escaped}"'


@pytest.mark.parametrize("key", [*PUBLISHED_TOPICS, "models.demo.topic"])
@pytest.mark.parametrize("character", REFUSED_CHARACTERS)
def test_a_topic_with_a_character_brokers_refuse_is_refused_at_load(
    tmp_path: Path, key: str, character: str
) -> None:
    """``weights.topic = "livefit/demo/weights\\t"`` loaded, then mosquitto dropped the
    connection at every publish and paho resent it in a loop (outside attack, issue 45):
    control characters (C0, DEL, C1), U+0000 and non-characters are refused naming the key,
    the character and where it is."""
    topic = f"livefit/demo/x{character}y"
    lines = PUBLISHED_TOPICS.get(key, "topic = '{topic}'").replace("'{topic}'", "{topic}")
    text = MINIMAL + lines.format(topic=toml_string(topic)) + "\n"
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, text), environ={})
    message = str(caught.value)
    assert f"{key}: {topic!r} is not an MQTT topic" in message, message
    assert f"(U+{ord(character):04X}) at character 15: MQTT brokers refuse it" in message
    assert "\n" not in message


@pytest.mark.parametrize("key", [*PUBLISHED_TOPICS, "models.demo.topic"])
def test_printable_unicode_in_topics_is_accepted(tmp_path: Path, key: str) -> None:
    """What brokers take stays accepted: non-ASCII letters, a no-break space, U+FFFD."""
    lines = PUBLISHED_TOPICS.get(key, "topic = '{topic}'").replace("'{topic}'", "{topic}")
    topic = "capteurs/é\u00a0ü/\ufffd/\U0001f600"
    settings = load_settings(write(tmp_path, MINIMAL + lines.format(topic=toml_string(topic))
                                   + "\n"), environ={})  # fmt: skip
    assert topic in {*settings.published_topics("demo").values(), settings.samples_topic("demo")}


def test_a_control_character_from_the_environment_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, MINIMAL),
                      environ={"LIVEFIT_MODELS__DEMO__DEAD_LETTER_TOPIC": "dead\x7fletters"})  # fmt: skip
    message = str(caught.value)
    assert message.startswith("invalid configuration: LIVEFIT_MODELS__DEMO__DEAD_LETTER_TOPIC=")
    assert "models.demo.dead_letter_topic: 'dead\\x7fletters' is not an MQTT topic" in message
    assert "a control character (U+007F) at character 5" in message


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        ("lerning_rate = 0.1", "models.demo.lerning_rate: unknown key; did you mean 'learning_rate'?"),
        ("[models.demo.train]\nmax_bach_size = 3",
         "models.demo.train.max_bach_size: unknown key; did you mean 'max_batch_size'?"),
        ("[models.demo.weights]\nrefused_unready = 3",
         "models.demo.weights.refused_unready: unknown key; did you mean 'refused_unready_s'?"),
        ("zzzzzz = 1",
         "models.demo.zzzzzz: unknown key (check the spelling against docs/configuration.md)"),
    ],
)  # fmt: skip
def test_an_unknown_key_gets_the_closest_known_one(tmp_path: Path, lines: str, said: str) -> None:
    """An unknown key said only "unknown key" (issue 45): the closest key of its table now,
    when one is close."""
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, MINIMAL + lines + "\n"), environ={})
    assert str(caught.value).endswith(said)
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, "[brokr]\nurl = 'x'\n" + MINIMAL), environ={})
    assert str(caught.value).endswith("brokr: unknown key; did you mean 'broker'?")


def test_shared_subscriptions_are_refused_saying_why(tmp_path: Path) -> None:
    """README used to say ``$share/group/...`` samples topics work while the validator refused
    every ``$`` topic: now the refusal says shared subscriptions are not supported, and why."""
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, MINIMAL + 'topic = "$share/g/livefit/demo/samples"\n'),
                      environ={})  # fmt: skip
    assert "models.demo.topic: shared subscriptions ($share/<group>/...) are not " \
           "supported: one learner takes a model's whole stream" in str(caught.value)  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, MINIMAL + 'topic = "$SYS/#"\n'), environ={})
    assert "the broker's own ($SYS/...), not data" in str(caught.value)


@pytest.mark.parametrize("value", ["1e-300", "0.5", "true", "false", "inf", "-inf", "nan", "-1"])
def test_target_outlier_std_is_0_or_a_finite_number_of_at_least_1(
    tmp_path: Path, value: str
) -> None:
    text = MINIMAL + f"[models.demo.train]\ntarget_outlier_std = {value}\n"
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, text), environ={})
    assert "models.demo.train.target_outlier_std" in str(caught.value)
    for good in ("0", "1", "3.5", "8", "1e6"):
        text = MINIMAL + f"[models.demo.train]\ntarget_outlier_std = {good}\n"
        settings = load_settings(write(tmp_path, text), environ={})
        assert settings.models["demo"].train.target_outlier_std == float(good)


BAD_LEARNING_SETTINGS = {
    "[models.demo.train]\nstart_lr_factor = {}": ["0.5", "0", "inf", "nan", "101", "'fast'"],
    "[models.demo.train]\nstart_steps = {}": ["0", "-3", "1.5"],
    "[models.demo.drift]\nreaction = {}": ["'restart'", "'boost'", "1"],
    "[models.demo.drift]\nboost_factor = {}": ["1", "0.5", "1000"],
}


@pytest.mark.parametrize(
    ("table", "value"),
    [(t, v) for t, values in BAD_LEARNING_SETTINGS.items() for v in values],
)
def test_fast_start_and_drift_reaction_settings_are_checked(
    tmp_path: Path, table: str, value: str
) -> None:
    text = MINIMAL + table.format(value) + "\n"
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, text), environ={})
    section, key = table.split("\n")[0].strip("[]"), table.split("\n")[1].split(" =")[0]
    assert f"{section}.{key}" in str(caught.value)


def test_fast_start_and_drift_reaction_settings_load(tmp_path: Path) -> None:
    text = MINIMAL + (
        "[models.demo.train]\nstart_lr_factor = 3\nstart_steps = 50\n"
        "[models.demo.drift]\nreaction = 'recover'\nboost_factor = 2.5\n"
    )
    model = load_settings(write(tmp_path, text), environ={}).models["demo"]
    assert (model.train.start_lr_factor, model.train.start_steps) == (3.0, 50)
    assert (model.drift.reaction, model.drift.boost_factor) == ("recover", 2.5)
    for reaction in ("none", "reset_optimizer", "boost_lr", "flush_replay"):
        text = MINIMAL + f"[models.demo.drift]\nreaction = '{reaction}'\n"
        assert load_settings(write(tmp_path, text), environ={}).models["demo"].drift.reaction == (
            reaction
        )


SELECTION = "[models.demo.selection]\nenabled = true\n"


def test_selection_settings_load_and_give_each_candidate_its_settings(tmp_path: Path) -> None:
    text = (
        MINIMAL
        + SELECTION
        + (
            "window = 200\nmargin = 0.1\n"
            "[[models.demo.selection.candidates]]\nname = 'slow'\nlearning_rate = 0.001\n"
            "[[models.demo.selection.candidates]]\nname = 'sgd'\noptimizer = 'sgd'\nseed = 7\n"
        )
    )
    model = load_settings(write(tmp_path, text), environ={}).models["demo"]
    assert [c.name for c in model.selection.candidates] == ["slow", "sgd"]
    assert (model.selection.window, model.selection.margin) == (200, 0.1)
    slow, sgd = model.candidate_settings("slow"), model.candidate_settings("sgd")
    assert (slow.learning_rate, slow.optimizer) == (0.001, model.optimizer)
    assert (sgd.optimizer, sgd.seed, sgd.learning_rate) == ("sgd", 7, model.learning_rate)
    assert model.candidate_settings("configured") is model
    assert ModelSettings(input_shape=[2], output_shape=[1]).selection.enabled is False


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("", "at least one entry in candidates"),
        ("[[models.demo.selection.candidates]]\nname = 'configured'\n", "always a candidate"),
        ("[[models.demo.selection.candidates]]\nname = 'a b'\n", "candidate name"),
        ("[[models.demo.selection.candidates]]\nname = 'x'\nbuilder = 'linear'\n", "architecture"),
        ("[[models.demo.selection.candidates]]\nname = 'x'\noptimizer = 'adamm'\n", "adamm"),
        ("[[models.demo.selection.candidates]]\nname = 'x'\nlearning_rate = 0\n", "learning_rate"),
        (
            "[[models.demo.selection.candidates]]\nname = 'x'\n"
            "[[models.demo.selection.candidates]]\nname = 'x'\n",
            "given twice",
        ),
        ("margin = 1\n[[models.demo.selection.candidates]]\nname = 'x'\n", "margin"),
    ],
)
def test_selection_settings_are_checked(tmp_path: Path, extra: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, MINIMAL + SELECTION + extra), environ={})
    assert expected in str(caught.value)
    assert "models.demo.selection" in str(caught.value)


@pytest.mark.parametrize(
    ("loss", "steps", "replay"),
    [("mse", 4, 2000), ("mae", 4, 2000), ("huber", 4, 2000), ("log_cosh", 4, 2000),
     ("binary_crossentropy", 2, 500), ("sparse_categorical_crossentropy", 2, 500),
     ("categorical_crossentropy", 2, 500), ("hinge", 2, 500)],
)  # fmt: skip
def test_update_defaults_by_the_loss_and_a_set_value_wins(
    loss: str, steps: int, replay: int
) -> None:
    """Unset, ``train.steps_per_batch`` is 4 for regression losses and 2 for the others, and
    ``train.replay_capacity`` 2,000 and 500 (the learning benchmark's findings); a value the
    user sets is kept for every loss, 0 replay included."""
    shapes = {"input_shape": [3], "output_shape": [2 if "categorical" in loss else 1]}
    settings = ModelSettings(loss=loss, **shapes)
    assert settings.train.steps_per_batch is None
    assert settings.resolved_steps_per_batch() == steps
    assert settings.train.replay_capacity is None
    assert settings.resolved_replay_capacity() == replay
    for chosen in (1, 2, 7):
        fixed = ModelSettings(loss=loss, train={"steps_per_batch": chosen}, **shapes)
        assert fixed.resolved_steps_per_batch() == chosen
    for capacity in (0, 1, 500, 2000, 10**6):
        fixed = ModelSettings(loss=loss, train={"replay_capacity": capacity}, **shapes)
        assert fixed.resolved_replay_capacity() == capacity
    with pytest.raises(ValueError, match="steps_per_batch"):
        ModelSettings(loss=loss, train={"steps_per_batch": 0}, **shapes)
    with pytest.raises(ValueError, match="replay_capacity"):
        ModelSettings(loss=loss, train={"replay_capacity": -1}, **shapes)


@pytest.mark.parametrize(
    ("input_shape", "loss", "capacity"),
    [([224, 224, 3], "mse", 445), ([224, 224, 3], "binary_crossentropy", 445),
     ([64, 64, 3], "mse", 2000), ([64, 64, 3], "binary_crossentropy", 500),
     ([2**20, 64], "mse", 1), ([10**6], "mse", 67)],
)  # fmt: skip
def test_the_default_replay_buffer_stays_within_256_mib(
    input_shape: list[int], loss: str, capacity: int
) -> None:
    """Unset, the replay capacity shrinks for large inputs so that the buffer (float32 inputs,
    targets and weights) holds at most 256 MiB, down to one sample; a set capacity is kept."""
    settings = ModelSettings(loss=loss, input_shape=input_shape, output_shape=[1])
    assert settings.resolved_replay_capacity() == capacity
    sample_bytes = 4 * (math.prod(input_shape) + 2)
    assert capacity == 1 or capacity * sample_bytes <= 256 * 2**20
    chosen = ModelSettings(
        loss=loss, input_shape=input_shape, output_shape=[1], train={"replay_capacity": 2000}
    )
    assert chosen.resolved_replay_capacity() == 2000


def holds_numbers(annotation: Any) -> bool:
    """Whether a setting of this type takes numbers (``float | Literal["auto"]``, ``list[int]``)."""
    return annotation in (int, float) or any(holds_numbers(arg) for arg in get_args(annotation))


def numeric_settings(model: type[BaseModel], table: str) -> Iterator[tuple[str, Any]]:
    """(key, type) of every setting that takes numbers, walked from the settings models so that
    a setting added later is covered; an item of a list of tables is ``<key>.0``."""
    for name, field in model.model_fields.items():
        key, annotation = f"{table}.{field.alias or name}".lstrip("."), field.annotation
        if key == "models":
            yield from numeric_settings(ModelSettings, "models.demo")
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from numeric_settings(annotation, key)
        elif get_origin(annotation) is list and issubclass(get_args(annotation)[0], BaseModel):
            yield from numeric_settings(get_args(annotation)[0], f"{key}.0")
        elif holds_numbers(annotation):
            yield key, annotation


NUMERIC_SETTINGS = dict(numeric_settings(Settings, ""))


def with_a_boolean(key: str, annotation: Any) -> str:
    """A configuration that sets ``key`` to TOML's ``true`` (``[true]`` for a list of numbers)."""
    members = (
        get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    )
    scalar = any(member in (int, float) for member in members)
    line = f"{key.rsplit('.', 1)[1]} = {'true' if scalar else '[true]'}\n"
    table = key.rsplit(".", 1)[0]
    if table == "models.demo":  # in place of MINIMAL's own line for the key, if any
        name = key.removeprefix("models.demo.")
        return "".join(m for m in MINIMAL.splitlines(True) if not m.startswith(f"{name} =")) + line
    if table.endswith(".0"):  # one of a list of tables, e.g. selection.candidates
        return MINIMAL + f"[[{table.removesuffix('.0')}]]\nname = 'b'\n" + line
    return MINIMAL + f"[{table}]\n" + line


@pytest.mark.parametrize("key", sorted(NUMERIC_SETTINGS))
def test_every_numeric_setting_refuses_a_boolean(tmp_path: Path, key: str) -> None:
    """TOML's true is 1 to pydantic's int and float: a flag written where a number belongs
    (``max_batch_size = true``, ``input_shape = [true]``) is refused, naming the key."""
    text = with_a_boolean(key, NUMERIC_SETTINGS[key])
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, text), environ={})
    assert f"{key}: must be a number, not a boolean" in str(caught.value)


def test_the_numeric_settings_are_found() -> None:
    """The walk above reaches every table: a number of each kind, in each place."""
    assert len(NUMERIC_SETTINGS) > 80
    for key in ("http.port", "models.demo.learning_rate", "models.demo.input_shape",
                "models.demo.serve.batch_timeout_ms", "processes.training_cores",
                "models.demo.labels.default_y", "models.demo.selection.candidates.0.learning_rate",
                "models.demo.experts.decay"):  # fmt: skip
        assert key in NUMERIC_SETTINGS
    assert "storage.wal" not in NUMERIC_SETTINGS and "broker.url" not in NUMERIC_SETTINGS


def test_a_boolean_from_the_environment_names_the_variable(tmp_path: Path) -> None:
    environ = {"LIVEFIT_MODELS__DEMO__TRAIN__MAX_BATCH_SIZE": "true"}
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, MINIMAL), environ=environ)
    assert str(caught.value) == (
        "invalid configuration: LIVEFIT_MODELS__DEMO__TRAIN__MAX_BATCH_SIZE=true: "
        "models.demo.train.max_batch_size: must be a number, not a boolean"
    )


def test_booleans_still_set_the_boolean_settings(tmp_path: Path) -> None:
    text = "[storage]\nwal = false\n" + MINIMAL + "dedup = true\n"
    settings = load_settings(write(tmp_path, text), environ={})
    assert (settings.storage.wal, settings.models["demo"].dedup) == (False, True)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("LIVEFIT_MODELS__DEMO__WEIGHTS__PULL_URL", "http://u:SECRET@learner:8000"),
        ("LIVEFIT_HTTP__PUBLIC_URL", "http://u:SECRET@learner:8000"),
    ],
)
def test_pull_urls_carry_no_password(tmp_path: Path, key: str, value: str) -> None:
    """A replica logs its pull origin at start; before, a password in it was logged with it."""
    config = tmp_path / "c.toml"
    config.write_text(learner_config("mqtt://x:1", tmp_path / "data", "env-nodes"))
    with pytest.raises(ConfigError, match="no user or password") as refused:
        load_settings(config, environ={key: value})
    assert "SECRET" not in str(refused.value)
