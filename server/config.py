"""Validated configuration: a TOML file, every key overridable by ``LIVEFIT_...`` environment vars.

``load_settings(path)`` reads the file (or the bundled example when ``path`` is None), lays the
environment over it (``LIVEFIT_HTTP__PORT=9000``,
``LIVEFIT_MODELS__DEMO__TRAIN__MAX_BATCH_SIZE=64``:
``__`` separates levels) and validates the whole tree at once. A bad or unknown key raises
``ConfigError`` whose message names the key, e.g. ``models.demo.train.max_batch_size``.
"""

from __future__ import annotations

import math
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from livefit.models import names
from livefit.models.outputs import (
    default_output_activation,
    default_target_scaling,
    output_problem,
    target_scaling_problem,
)

ENV_PREFIX = "LIVEFIT_"
ENV_DELIMITER = "__"
BUILTIN_BUILDERS = ("linear", "mlp", "lstm")  # = livefit.models.BUILTIN_BUILDERS; no TF import here
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_BUILDER_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class ConfigError(ValueError):
    """The configuration is invalid; the message names every bad key and why."""


class _Section(BaseModel):
    # Numbers become strings where a string is expected: LIVEFIT_..._HMAC_KEY=123456 is a key.
    model_config = ConfigDict(extra="forbid", validate_default=True, coerce_numbers_to_str=True)


class TlsSettings(_Section):
    """TLS material for ``mqtts://`` brokers (all paths are PEM files)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False  # skip hostname verification: for test CAs only


class BrokerSettings(_Section):
    """How livefit reaches its MQTT broker."""

    url: str = "auto"
    client_id: str = "livefit-learner"
    protocol: Literal["5", "3.1.1"] = "5"
    keepalive_s: int = Field(30, ge=5, le=3600)
    session_expiry_s: int = Field(86400, ge=0)
    receive_maximum: int = Field(1000, ge=1, le=65535)
    reconnect_min_s: float = Field(0.5, gt=0)
    reconnect_max_s: float = Field(5.0, gt=0)
    connect_timeout_s: float = Field(10.0, gt=0)
    tls: TlsSettings = TlsSettings()

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if value != "auto" and not re.match(r"^mqtts?://[^/]+$", value):
            raise ValueError('must be "auto" or mqtt://[user:pass@]host:port or mqtts://...')
        return value


class HttpSettings(_Section):
    """Where the HTTP API listens, and the address other processes use to reach it."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    public_url: str | None = None  # default http://<host>:<port>; put in weight manifests
    token: SecretStr | None = None  # bearer token for the weight download (and predictions)
    protect_predictions: bool = False  # require the token on prediction and model endpoints
    body_timeout_s: float = Field(10.0, gt=0)  # a request body must arrive within this
    # Connection limits (server/api/connections.py): a request head must arrive within
    # header_timeout_s (of the connection opening, or of a later request's first byte), an idle
    # connection is closed after keep_alive_timeout_s, a head over max_header_bytes gets 431,
    # and at most max_connections are open (the oldest idle or head-sending one makes room).
    header_timeout_s: float = Field(10.0, gt=0)
    keep_alive_timeout_s: float = Field(5.0, gt=0)
    max_connections: int = Field(1000, ge=16)
    max_header_bytes: int = Field(65536, ge=1024)
    # Processes answering HTTP on http.port. `livefit replica`: that many whole replicas
    # (server/processes/workers.py; 0 and 1 both mean one process). `livefit serve`: 0 serves
    # predictions from the learner's own process; N >= 1 splits the learner into a training
    # process and N serving processes (server/processes/learner_group.py). Unset: 1 replica
    # process, and the learner in one process (measured as fast on 2 cores: BENCHMARKS.md).
    workers: int | None = Field(None, ge=0, le=64)

    def replica_workers(self) -> int:
        return max(1, self.workers or 1)

    def learner_workers(self) -> int:
        return self.workers or 0

    def connection_protocol(self, runtime: Any = None) -> Any:
        """The uvicorn HTTP protocol class that enforces the connection limits and, given the
        runtime, refuses prediction requests its models cannot admit from their heads."""
        from livefit.server.api.connections import protocol_class

        return protocol_class(self, runtime)

    def token_bytes(self) -> bytes | None:
        return self.token.get_secret_value().encode() if self.token else None

    def base_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"


class StorageSettings(_Section):
    """Where and how livefit keeps state: write-ahead log, checkpoints, broker persistence."""

    dir: str = "./livefit-data"
    wal: bool = True  # acknowledge samples only once they are in the write-ahead log
    fsync: bool = (
        True  # fsync each WAL commit (and checkpoints): survive power loss, not only crashes
    )
    wal_segment_bytes: int = Field(64 * 1024 * 1024, ge=4096)
    wal_group_max: int = Field(1000, ge=1)  # messages per WAL commit at most
    # A commit waits up to this long for more messages once the inbox is empty (one fsync for
    # the group); 0: commit as soon as the inbox is empty.
    wal_commit_window_ms: float = Field(1.0, ge=0, le=1000)


class LoggingSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    json_format: bool = Field(False, alias="json")

    model_config = ConfigDict(extra="forbid", populate_by_name=True, coerce_numbers_to_str=True)


class TrainSettings(_Section):
    """How the trainer forms minibatches from the sample queue."""

    max_batch_size: int = Field(256, ge=1, le=65536)
    max_wait_ms: float = Field(0.0, ge=0, le=60_000)
    queue_capacity: int = Field(20_000, ge=1)  # samples held between ingestion and training
    # The update policy (defaults measured by the learning-quality benchmark, BENCHMARKS.md):
    steps_per_batch: int = Field(2, ge=1, le=100)  # gradient steps on each minibatch
    replay_capacity: int = Field(500, ge=0)  # samples kept for replay (0: no replay)
    replay_mode: Literal["reservoir", "window"] = "window"
    replay_share: float = Field(0.75, ge=0, lt=1)  # share of replayed samples in each step
    # "caught_up": steps beyond the first and replayed samples only for a batch that took every
    # queued sample, while no prediction request waits (the trainer keeps up, so the extra work
    # uses time it would spend waiting); otherwise one plain step. "always": every batch.
    extras_when: Literal["caught_up", "always"] = "caught_up"
    # Before each step, wait up to this long while prediction requests are queued (0: never).
    yield_to_serving_ms: float = Field(2.0, ge=0, le=1000)


class DriftSettings(_Section):
    """Drift detection on the prequential loss, and what to do when it fires."""

    enabled: bool = True  # detect, count and report drift (a cheap test on the losses)
    method: Literal["page_hinkley", "adwin"] = "page_hinkley"
    threshold: float = Field(50.0, gt=0)  # Page-Hinkley lambda, in standardised loss units
    reaction: Literal["none", "reset_optimizer", "boost_lr"] = "none"
    boost_factor: float = Field(3.0, gt=1)  # learning rate multiplier for boost_lr
    boost_steps: int = Field(200, ge=1)  # training steps the boost lasts
    events_topic: str | None = None  # default livefit/<name>/events


class ServeSettings(_Section):
    """Request batching and limits for the prediction API."""

    max_batch_size: int = Field(64, ge=1, le=65536)
    # 0: a batch fires as soon as the model is free, with every request queued by then (they
    # queue while the previous batch runs). Measured: 3.3x the requests/s of 2 ms at 1 client,
    # the same or better at 64 (BENCHMARKS.md); Triton's default is also 0. "auto": chosen
    # per batch from the measured arrival rate and batch cost (0 unless waiting lowers the mean
    # latency; server/inference/batch_cost.py AutoTimeout), at most max_batch_timeout_ms. Not the
    # default:
    # measured within noise of 0 at 1, 16 and 64 clients, where on the CPU benchmark model it
    # chooses 0 or under 1 ms anyway; its case (a GPU) is unmeasured (BENCHMARKS.md).
    batch_timeout_ms: float | Literal["auto"] = 0.0
    max_batch_timeout_ms: float = Field(10.0, ge=0, le=10_000)
    max_queue_rows: int = Field(4096, ge=1)
    # Admission: a request that cannot join the next batch is refused at once (429) when the
    # batcher expects it to wait longer than this before its batch starts (from the event
    # loop's lag and the batch cost it fits online); any request, when it would be answered
    # after its deadline. "auto": two full-batch model calls, at least 50 ms.
    max_queue_wait_ms: float | Literal["auto"] = "auto"
    default_deadline_ms: float = Field(5000.0, gt=0)
    allowed_batch_sizes: list[int] | None = None
    max_request_rows: int = Field(1024, ge=1)
    max_request_bytes: int = Field(8 * 1024 * 1024, ge=1024)

    @field_validator("batch_timeout_ms")
    @classmethod
    def _check_timeout(cls, value: float | str) -> float | str:
        if value != "auto" and not 0 <= float(value) <= 10_000:
            raise ValueError('must be "auto" or a number of milliseconds from 0 to 10000')
        return value

    @field_validator("max_queue_wait_ms")
    @classmethod
    def _check_wait(cls, value: float | str) -> float | str:
        if value != "auto" and not 0 < float(value) <= 600_000:
            raise ValueError('must be "auto" or a number of milliseconds above 0')
        return value

    @model_validator(mode="after")
    def _check_sizes(self) -> ServeSettings:
        sizes = self.allowed_batch_sizes
        if sizes is not None:
            if not sizes or sorted(set(sizes)) != sizes or sizes[0] < 1:
                raise ValueError("allowed_batch_sizes must be strictly increasing positive ints")
            if sizes[-1] != self.max_batch_size:
                raise ValueError("the last allowed_batch_sizes entry must equal max_batch_size")
        return self

    def batch_sizes(self) -> list[int]:
        """The padded batch sizes the inference function sees (powers of two by default)."""
        if self.allowed_batch_sizes is not None:
            return list(self.allowed_batch_sizes)
        sizes, size = [], 1
        while size < self.max_batch_size:
            sizes.append(size)
            size *= 2
        return [*sizes, self.max_batch_size]


class WeightsSettings(_Section):
    """The weight stream: how often snapshots go out, how they are signed and verified."""

    # The weight topic gets at most one snapshot (the newest) per publish_interval_s; the
    # learner's own serving (in its process, or its serving processes) one per
    # serve_interval_s, stretched to 20x the time a snapshot's copy takes (server/training).
    publish_interval_s: float = Field(0.5, gt=0, le=3600)
    serve_interval_s: float = Field(0.15, gt=0, le=3600)
    topic: str | None = None
    # Learner: Ed25519 private key (PEM, or raw/base64/hex seed); default
    # <storage.dir>/keys/weights-signing.key, created on first start.
    signing_key_file: str | None = None
    # Replicas, WeightSubscriber: the learner's public key (base64 of the raw 32 bytes, or PEM)
    # or a file holding it; default <storage.dir>/keys/weights-signing.pub when it exists.
    verify_key: str | None = None
    verify_key_file: str | None = None
    allow_unsigned: bool = False  # replicas: accept weights nobody signed (trusted networks only)
    hmac_key: SecretStr | None = None  # shared secret (weaker: any holder can forge)
    max_inline_bytes: int = Field(16 * 1024 * 1024, ge=1024)  # larger: manifest + HTTP pull
    keep_versions: int = Field(4, ge=1, le=100)  # recent payloads kept for HTTP download
    pull_url: str | None = None  # replicas: the learner's base URL to pull from (http.public_url)
    pull_timeout_s: float = Field(30.0, gt=0)
    max_pull_bytes: int = Field(256 * 1024 * 1024, ge=1024)  # a pulled payload larger: refused
    max_age_s: float = Field(86400.0, ge=0)  # refuse weights signed longer ago (0: no limit)
    refresh_interval_s: float = Field(3600.0, gt=0)  # learner re-signs its newest snapshot

    @field_validator("pull_url")
    @classmethod
    def _check_pull_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/?#]+(/[^?#]*)?$", value):
            raise ValueError("must be the learner's base URL, http(s)://host:port")
        return value.rstrip("/") if value else value

    @model_validator(mode="after")
    def _check_verify_key(self) -> WeightsSettings:
        if self.verify_key and self.verify_key_file:
            raise ValueError("set verify_key or verify_key_file, not both")
        return self

    def key_bytes(self) -> bytes | None:
        return self.hmac_key.get_secret_value().encode() if self.hmac_key else None


class CheckpointSettings(_Section):
    """How often a model's training state is saved (and at shutdown)."""

    interval_s: float = Field(30.0, gt=0)
    keep: int = Field(3, ge=1, le=1000)


class LabelsSettings(_Section):
    """Delayed labels (README "Delayed labels"): how long a prediction waits for its label."""

    ttl_s: float = Field(3600.0, gt=0)  # a prediction (or early label) waits this long at most
    max_pending: int = Field(100_000, ge=1, le=10_000_000)  # predictions waiting, at most
    on_expiry: Literal["drop", "default"] = "drop"  # "default": learn default_y instead
    default_y: float | list[Any] | None = None  # the label learned on expiry (target-shaped)
    tick_s: float = Field(1.0, gt=0, le=3600)  # how often the learner checks for expiry
    record_buffer_rows: int = Field(10_000, ge=1)  # serving side: records waiting for the broker
    topic: str | None = None  # default livefit/<name>/labels
    predictions_topic: str | None = None  # default livefit/<name>/predictions

    @model_validator(mode="after")
    def _check_default(self) -> LabelsSettings:
        if self.on_expiry == "default" and self.default_y is None:
            raise ValueError('on_expiry = "default" needs default_y, the label to learn')
        return self


class ModelSettings(_Section):
    """One model: its network, its training stream and its serving limits."""

    builder: str = "mlp"
    builder_options: dict[str, Any] = Field(default_factory=dict)
    input_shape: list[int]
    output_shape: list[int]
    target_shape: list[int] | None = None  # default: output_shape ([] for sparse categorical)
    loss: str = "mse"
    # nadam at 0.01: measured best of the sweep in BENCHMARKS.md ("Learning quality") on all
    # three streams (adam at 0.001 trailed logistic regression by 5.8, 0.8 and 2.2 points).
    optimizer: str = "nadam"
    learning_rate: float = Field(0.01, gt=0)
    metrics: list[str] = Field(default_factory=list)
    scaling: Literal["none", "standardize"] = "standardize"  # online per-feature scaling
    # Online target standardization; None: "standardize" for regression losses (mse, mae,
    # huber, log_cosh), else "none" (see resolved_target_scaling).
    target_scaling: Literal["standardize", "none"] | None = None
    device: str = "auto"  # "auto" picks /GPU:0 when TensorFlow sees one, else /CPU:0
    topic: str | None = None
    dead_letter_topic: str | None = None
    max_message_bytes: int = Field(1024 * 1024, ge=64)
    max_samples_per_message: int = Field(10_000, ge=1)
    prequential_window: int = Field(1000, ge=1)
    dedup: bool = False  # drop messages whose (source, seq) was already accepted
    # Readiness fails while messages have waited this long with no message finished
    # (accepted or rejected): a learner that is not learning says so.
    stall_after_s: float = Field(30.0, gt=0)
    seed: int | None = None
    train: TrainSettings = TrainSettings()
    serve: ServeSettings = ServeSettings()
    weights: WeightsSettings = WeightsSettings()
    checkpoint: CheckpointSettings = CheckpointSettings()
    labels: LabelsSettings = LabelsSettings()
    drift: DriftSettings = DriftSettings()

    @field_validator("builder")
    @classmethod
    def _check_builder(cls, value: str) -> str:
        if value not in BUILTIN_BUILDERS and not _BUILDER_PATH.match(value):
            raise ValueError(
                f"unknown builder {value!r}: use one of {', '.join(BUILTIN_BUILDERS)} "
                'or "package.module:function"'
            )
        if value not in BUILTIN_BUILDERS:
            names.check_builder_module(value)
        return value

    @field_validator("loss")
    @classmethod
    def _check_loss(cls, value: str) -> str:
        names.check_loss(value)  # the names keras.losses.get takes, without importing Keras
        return value

    @field_validator("optimizer")
    @classmethod
    def _check_optimizer(cls, value: str) -> str:
        names.check_optimizer(value)
        return value

    @field_validator("metrics")
    @classmethod
    def _check_metrics(cls, value: list[str]) -> list[str]:
        for name in value:
            if name != "accuracy":
                raise ValueError(f"unknown metric {name!r}{names.suggest(name, ['accuracy'])}")
        return value

    @field_validator("builder_options")
    @classmethod
    def _check_builder_options(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        names.check_builder_options(info.data.get("builder", ""), value)
        return value

    @field_validator("input_shape", "output_shape")
    @classmethod
    def _check_shape(cls, value: list[int]) -> list[int]:
        if not value or any(d < 1 for d in value):
            raise ValueError("must be a non-empty list of positive ints")
        return value

    @field_validator("dead_letter_topic")
    @classmethod
    def _check_publish_topic(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(c in value for c in "#+\0")):
            raise ValueError("must be a non-empty MQTT topic without wildcards")
        return value

    @field_validator("target_shape")
    @classmethod
    def _check_target_shape(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(d < 1 for d in value):
            raise ValueError("must be a list of positive ints ([] for a scalar target)")
        return value

    @field_validator("topic")
    @classmethod
    def _check_topic(cls, value: str | None) -> str | None:
        if value is not None and (not value or "\0" in value or value.startswith("$")):
            raise ValueError("must be a non-empty MQTT topic (wildcards + and # are allowed)")
        return value

    @model_validator(mode="after")
    def _check_output_fits_loss(self) -> ModelSettings:
        """A built-in network's output activation, and the target scaling, must fit the loss
        (livefit.models.outputs): a combination that cannot train is an error naming both."""
        if self.target_scaling is not None:
            problem = target_scaling_problem(
                self.loss, self.target_scaling, self.resolved_target_shape(), self.output_shape
            )
            if problem is not None:
                raise ValueError(problem)
        if self.builder in BUILTIN_BUILDERS:
            activation = self.builder_options.get("output_activation")
            if activation is None:
                activation = default_output_activation(self.loss)
            problem = output_problem(self.loss, activation, self.output_shape)
            if problem is not None:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _check_default_label(self) -> ModelSettings:
        """``labels.default_y`` must be a label of the model's target shape."""
        default = self.labels.default_y
        if default is None:
            return self
        shape = self.resolved_target_shape()
        try:
            array = np.asarray(default, dtype=np.float32)
        except (ValueError, TypeError):
            raise ValueError("labels.default_y must be a number or a list of numbers") from None
        if array.size != math.prod(shape) or not np.isfinite(array).all():
            raise ValueError(
                f"labels.default_y must be {math.prod(shape)} finite number(s), the target "
                f"shape {shape}; got {default!r}"
            )
        return self

    def resolved_target_scaling(self) -> str:
        """``target_scaling``, else ``standardize`` for regression losses, else ``none``."""
        if self.target_scaling is not None:
            return self.target_scaling
        return default_target_scaling(self.loss, self.resolved_target_shape(), self.output_shape)

    def resolved_target_shape(self) -> list[int]:
        """A label's shape: ``target_shape``, else [] for sparse categorical, else output_shape."""
        if self.target_shape is not None:
            return list(self.target_shape)
        if self.loss.startswith("sparse_categorical"):
            return []
        return list(self.output_shape)


class TensorFlowSettings(_Section):
    """TensorFlow's thread pools, for the whole process (0: TensorFlow's default, one thread
    per core). Fewer intra-op threads leave cores to the event loop when one process both
    trains and serves on a small machine."""

    intra_op_threads: int = Field(0, ge=0, le=1024)
    inter_op_threads: int = Field(0, ge=0, le=1024)


class ProcessSettings(_Section):
    """Operating-system settings of a split learner's processes (``http.workers`` >= 1)."""

    # Added to the training process's niceness (every thread: ingestion, trainers, TensorFlow's
    # pools). When training and serving both want the cores, the kernel gives them to the
    # serving processes first; an idle machine still trains at full speed. 0: equal shares.
    training_niceness: int = Field(10, ge=0, le=19)


class Settings(_Section):
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
    if name in ("token", "hmac_key", "password"):
        return "***"
    shown = re.sub(r"//[^/@]*@", "//***@", raw)
    return shown if len(shown) <= 80 else shown[:77] + "..."


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
            message = "unknown key (check the spelling against the README's configuration table)"
        elif error["type"] == "value_error":
            message = message.removeprefix("Value error, ")
        origin = next((v for path, v in from_env.items() if loc[: len(path)] == path), None)
        in_file = in_file or origin is None
        problems.append(f"{origin}: {key}: {message}" if origin else f"{key}: {message}")
    where = f"invalid configuration ({file})" if in_file else "invalid configuration"
    if len(problems) == 1:
        return f"{where}: {problems[0]}"
    return "\n".join([f"{where}:", *(f"  {problem}" for problem in problems)])
