"""Validated configuration: a TOML file, every key overridable by ``LIVEFIT_...`` environment vars.

``load_settings(path)`` reads the file (or the bundled example when ``path`` is None), lays the
environment over it (``LIVEFIT_HTTP__PORT=9000``,
``LIVEFIT_MODELS__DEMO__TRAIN__MAX_BATCH_SIZE=64``:
``__`` separates levels) and validates the whole tree at once. A bad or unknown key raises
``ConfigError`` whose message names the key, e.g. ``models.demo.train.max_batch_size``.

This module owns the whole tree (``Settings``), its loading and the environment overrides; the
sections are declared in ``config.sections`` (the process's: broker, HTTP, storage...),
``config.model`` (``ModelSettings``) and ``config.model_tables`` (a model's train, serve,
weights... tables), and every name is re-exported here.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError, field_validator, model_validator

from .broker_urls import hide_credentials
from .model import ModelSettings
from .sections import (
    BrokerSettings,
    HttpSettings,
    LoggingSettings,
    ProcessSettings,
    Section,
    StorageSettings,
    TensorFlowSettings,
)
from .topic_filters import filter_problem, topic_matches

ENV_PREFIX = "LIVEFIT_"
ENV_DELIMITER = "__"
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ConfigError(ValueError):
    """The configuration is invalid; the message names every bad key and why."""


class Settings(Section):
    """The whole livefit configuration."""

    broker: BrokerSettings = BrokerSettings()
    http: HttpSettings = HttpSettings()
    storage: StorageSettings = StorageSettings()
    logging: LoggingSettings = LoggingSettings()
    tensorflow: TensorFlowSettings = TensorFlowSettings()
    processes: ProcessSettings = ProcessSettings()
    models: dict[str, ModelSettings]

    @field_validator("models")
    @classmethod
    def _check_models(cls, value: dict[str, ModelSettings]) -> dict[str, ModelSettings]:
        if not value:
            raise ValueError("at least one [models.<name>] table is required")
        for name in value:
            if not _MODEL_NAME.match(name):
                raise ValueError(f"model name {name!r} must match {_MODEL_NAME.pattern}")
        return value

    @model_validator(mode="after")
    def _check_no_feedback_loop(self) -> Settings:
        """No data subscription may match a topic livefit publishes, except the one it exists
        to read (a model's labels and prediction records): a ``#`` samples topic over the
        weight topic made a learner consume its own weights and dead-letter reports, each
        rejection publishing another report it then read (outside attack, issue 26)."""
        published = [
            (topic, name, kind)
            for name in self.models
            for kind, topic in self.published_topics(name).items()
        ]
        for name in self.models:
            for key, (kind, topic_filter) in self.data_subscriptions(name).items():
                if filter_problem(topic_filter) is not None:
                    continue  # the topic's own validator says what is wrong with it
                for topic, publisher, published_kind in published:
                    if (publisher, published_kind) == (name, kind):
                        continue  # the subscription's own purpose
                    if topic_matches(topic_filter, topic):
                        raise ValueError(
                            f"{key} {topic_filter!r} would consume {topic!r}, the "
                            f"{published_kind} topic livefit publishes for model {publisher}: "
                            "a learner must not read its own output; choose topics that do "
                            "not overlap"
                        )
        return self

    def published_topics(self, name: str) -> dict[str, str]:
        """Kind -> topic, for every topic livefit publishes for model ``name``: weights and
        manifests, dead-letter reports and drift events (the learner), prediction records and
        labels (serving processes and replicas, read back by the learner)."""
        return {
            "weights": self.weights_topic(name),
            "dead-letter": self.dead_letter_topic(name),
            "events": self.events_topic(name),
            "predictions": self.predictions_topic(name),
            "labels": self.labels_topic(name),
        }

    def data_subscriptions(self, name: str) -> dict[str, tuple[str, str]]:
        """Setting -> (kind, topic filter), for every subscription the learner of model
        ``name`` makes for its input."""
        return {
            f"models.{name}.topic": ("samples", self.samples_topic(name)),
            f"models.{name}.labels.topic": ("labels", self.labels_topic(name)),
            f"models.{name}.labels.predictions_topic": (
                "predictions", self.predictions_topic(name),
            ),
        }  # fmt: skip

    def samples_topic(self, name: str) -> str:
        return self.models[name].topic or f"livefit/{name}/samples"

    def dead_letter_topic(self, name: str) -> str:
        return self.models[name].dead_letter_topic or f"livefit/{name}/rejected"

    def weights_topic(self, name: str) -> str:
        return self.models[name].weights.topic or f"livefit/{name}/weights"

    def events_topic(self, name: str) -> str:
        return self.models[name].drift.events_topic or f"livefit/{name}/events"

    def labels_topic(self, name: str) -> str:
        return self.models[name].labels.topic or f"livefit/{name}/labels"

    def predictions_topic(self, name: str) -> str:
        return self.models[name].labels.predictions_topic or f"livefit/{name}/predictions"


def bundled_example_path() -> Path:
    """The example config shipped with the package (one MLP model called ``demo``)."""
    return Path(str(resources.files("livefit") / "examples" / "demo.toml"))


def load_settings(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Read ``path`` (default: the bundled example), apply ``LIVEFIT_*`` overrides, validate."""
    file = Path(path) if path is not None else bundled_example_path()
    try:
        with file.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {file}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: invalid TOML: {exc}") from exc
    from_env = _apply_env(data, os.environ if environ is None else environ)
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, file, from_env)) from None


def _apply_env(data: dict[str, Any], environ: Mapping[str, str]) -> dict[tuple[str, ...], str]:
    """Lay ``LIVEFIT_A__B__C=value`` over ``data["a"]["b"]["c"]`` (values parsed as TOML).

    Returns where each value came from, ``("a", "b", "c") -> "LIVEFIT_A__B__C=value"``, so
    that an error names the variable rather than the file.
    """
    origins: dict[tuple[str, ...], str] = {}
    for key, raw in sorted(environ.items()):
        if not key.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in key[len(ENV_PREFIX) :].split(ENV_DELIMITER)]
        if len(parts) < 2 or not all(parts):
            continue  # LIVEFIT_CONFIG and friends are CLI inputs, not settings
        if parts[0] == "models":
            parts[1] = _match_model_name(data, parts[1])
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{key}: {'.'.join(parts)} cannot be set, its parent is a value")
            node = child
        node[parts[-1]] = _parse_env_value(raw)
        origins[tuple(parts)] = f"{key}={_shown_env_value(parts[-1], raw)}"
    return origins


def _match_model_name(data: dict[str, Any], lowered: str) -> str:
    """Env names are case-insensitive; model names are not: reuse the file's spelling."""
    for name in data.get("models", {}):
        if name.lower() == lowered:
            return str(name)
    return lowered


def _parse_env_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare string such as mqtt://host:1883


def _shown_env_value(name: str, raw: str) -> str:
    """An environment value as an error may show it: secrets and URL credentials hidden."""
    if name in ("token", "admin_token", "pull_token", "hmac_key", "password"):
        return "***"
    shown = hide_credentials(raw)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _did_you_mean(loc: tuple[str, ...]) -> str:
    """``; did you mean 'x'?`` for the closest known key beside the unknown one at ``loc``,
    else where to look."""
    known = _keys_at(loc[:-1])
    close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return " (check the spelling against docs/configuration.md)"


def _keys_at(path: tuple[str, ...]) -> list[str]:
    """The keys the table at ``path`` may hold (after ``models``, a model's name)."""
    model: type[BaseModel] = Settings
    parts = list(path)
    while parts:
        part = parts.pop(0)
        if model is Settings and part == "models":
            if not parts:
                return []  # model names are the user's
            parts.pop(0)
            model = ModelSettings
            continue
        field = model.model_fields.get(part)
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return [field.alias or name for name, field in model.model_fields.items()]


def _describe(
    exc: ValidationError, file: Path, from_env: Mapping[tuple[str, ...], str] | None = None
) -> str:
    """One line for one error; a line per error otherwise. An error in a value an environment
    variable set names the variable (``LIVEFIT_...=value: key: message``), not the file."""
    from_env = from_env or {}
    problems, in_file = [], False
    for error in exc.errors():
        loc = tuple(str(p) for p in error["loc"])
        key = ".".join(loc) or "(root)"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown key" + _did_you_mean(loc)
        elif error["type"] == "value_error":
            message = message.removeprefix("Value error, ")
        origin = next((v for path, v in from_env.items() if loc[: len(path)] == path), None)
        in_file = in_file or origin is None
        if not loc:  # a check across the tree; its message names the keys
            problems.append(message)
            continue
        problems.append(f"{origin}: {key}: {message}" if origin else f"{key}: {message}")
    where = f"invalid configuration ({file})" if in_file else "invalid configuration"
    if len(problems) == 1:
        return f"{where}: {problems[0]}"
    return "\n".join([f"{where}:", *(f"  {problem}" for problem in problems)])
