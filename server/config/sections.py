"""The sections of the whole process: the broker (with TLS), HTTP, storage, logging,
TensorFlow's thread pools and the split learner's processes; and ``Section``, the base of
every settings table (unknown keys refused, defaults validated).

This module owns those tables; a model's tables are ``config.model``'s and
``config.model_tables``', and the whole tree, its loading and the environment overrides are
``config``'s, which re-exports every name here.
"""

from __future__ import annotations

import re
import socket
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator

from .broker_urls import broker_url_list, hide_credentials, parse_broker_urls
from .machine import default_serving_processes

MIN_WORKER_TIMEOUT_S = 3.0  # http.worker_timeout_s: three heartbeats (server/base/heartbeat.py)


def without_credentials(url: str | None, secret_setting: str) -> str | None:
    """``url`` unchanged, or ValueError if it carries a user or password: livefit logs the HTTP
    URLs it pulls from, so a secret goes in ``secret_setting`` (a header), never in the URL."""
    if url is not None and "@" in url.split("://", 1)[-1].split("/", 1)[0]:
        raise ValueError(f"no user or password in the URL (it is logged): set {secret_setting}")
    return url


def _takes_numbers(annotation: Any) -> bool:
    """Whether a setting of this type holds numbers: ``int``, ``float`` or a type made of them
    (``float | Literal["auto"]``, ``list[int] | None``); ``bool`` is not one."""
    return annotation in (int, float) or any(_takes_numbers(arg) for arg in get_args(annotation))


def _holds_boolean(value: Any) -> bool:
    if isinstance(value, list | tuple):
        return any(_holds_boolean(item) for item in value)
    return isinstance(value, bool)


class Section(BaseModel):
    """The base of every settings table: unknown keys refused, defaults validated, booleans
    refused where numbers belong."""

    # Numbers become strings where a string is expected: LIVEFIT_..._HMAC_KEY=123456 is a key.
    model_config = ConfigDict(extra="forbid", validate_default=True, coerce_numbers_to_str=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic takes TOML's true as 1 for an int or a float: a flag in a number's place.
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and _takes_numbers(field.annotation) and _holds_boolean(value):
            raise ValueError("must be a number, not a boolean")
        return value


class TlsSettings(Section):
    """TLS material for ``mqtts://`` brokers (all paths are PEM files)."""

    ca_file: str | None = Field(None, description="CA bundle for `mqtts://`")
    cert_file: str | None = Field(None, description="client certificate (PEM)")
    key_file: str | None = Field(None, description="client key (PEM)")
    insecure: bool = Field(False, description="skip hostname verification (test CAs only)")


class BrokerSettings(Section):
    """How livefit reaches its MQTT broker."""

    url: str | list[str] = Field(
        "auto",
        description=(
            '`"auto"`, `mqtt://[user:pass@]host:port` or `mqtts://...`, or a cluster\'s nodes (a '
            "list, or URLs separated by commas), tried in turn: see [The broker](#the-broker) "
            "above; credentials in the URL are never logged"
        ),
    )
    client_id: str = Field(
        "livefit-learner",
        description=(
            "fixed MQTT client id prefix: each model has its own session `<client_id>-<model>` "
            "(its own receive window and backpressure), which the broker keeps (with "
            "unacknowledged samples) across restarts; replicas derive their own ids from it. Two "
            "processes must not share it: the broker then disconnects one for the other. livefit "
            "logs it naming the id (a session taken over, or dropped three times in a row within 5 "
            "s of connecting, as mosquitto 2.0 does), answers readiness 503 naming it for 30 s, "
            "and waits 30 s before reconnecting, so the session stays with one of the two instead "
            "of changing hands every second. The default stays a fixed name: a learner's "
            "persistent session (its queued samples) is found by it across restarts and upgrades"
        ),
    )
    protocol: Literal["5", "3.1.1"] = Field(
        "5",
        description=(
            '`"5"` or `"3.1.1"`, for every MQTT client of the process (learner, replicas\' '
            "weight stream; the weight stream carries its signature in the payload, so it works "
            'over both). With `"5"`, a broker that refuses MQTT 5 as unsupported (amqtt) is '
            "spoken to over 3.1.1, with a warning"
        ),
    )
    keepalive_s: int = Field(30, ge=5, le=3600, description="MQTT keepalive")
    session_expiry_s: int = Field(
        86400,
        ge=0,
        description="how long the broker keeps the learner's session while it is away (MQTT 5)",
    )
    receive_maximum: int = Field(
        1000,
        ge=1,
        le=65535,
        description=(
            "unacknowledged messages the broker may send at once: the bound on in-memory messages, "
            "and the backpressure window"
        ),
    )
    reconnect_min_s: float = Field(
        0.5,
        gt=0,
        description="first reconnect delay (whole seconds, at least 1, as paho takes them)",
    )
    reconnect_max_s: float = Field(5.0, gt=0, description="reconnect backoff ceiling")
    connect_timeout_s: float = Field(
        10.0,
        gt=0,
        description=(
            "how long start waits for the first connection before going on (paho keeps retrying). "
            "While the broker cannot be reached, the log says so at the first failed attempt and "
            "then 1, 2, 4 ... up to 60 s apart, with the count of attempts, and readiness is 503 "
            "with `model <name>: MQTT broker at <url> unreachable (<n> connection attempts "
            "failed)`. A broker that answers and refuses (a wrong user or password, an ACL) is "
            "logged likewise as `refused the connection: Not authorized; check the user and "
            "password in broker.url ...`, and readiness says so. Replicas do the same for their "
            "weight stream; the dashboard's status line shows what readiness says"
        ),
    )
    max_packet_size_bytes: int | None = Field(
        None,
        ge=1024,
        description=(
            "no PUBLISH larger than this is sent; the broker's own Maximum Packet Size (MQTT 5 "
            "CONNACK: mosquitto `max_packet_size`) applies too, so set this only for an MQTT 3.1.1 "
            "broker with a limit (AWS IoT Core: 128 KB). A broker drops the connection of a client "
            "that sends more (ingestion with it); a snapshot over the limit is announced by a "
            "manifest and pulled over HTTP, and any other message over it is not sent, counted in "
            '`livefit_broker_publish_refused_total{reason="over_max_packet_size"}` and logged '
            "naming the limit"
        ),
    )
    tls: TlsSettings = TlsSettings()

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | list[str]) -> str | list[str]:
        if value == "auto":
            return value
        urls = broker_url_list(value)
        for url in urls:
            if not re.match(r"^mqtts?://[^/]+$", url):
                raise ValueError(
                    '"auto", mqtt://[user:pass@]host:port or mqtts://..., or a list of such URLs '
                    f"(a cluster's nodes), expected (percent-encode : / @ # ? % in a password); "
                    f"got {hide_credentials(url)!r}"
                )
        if len({url.partition("://")[0] for url in urls}) > 1:
            raise ValueError("mixes mqtt:// and mqtts://: every node must use the same one")
        # What the clients will parse, parsed now: a bad port, no host, the same node twice or
        # different users stop the process here, not in its startup with a traceback.
        parse_broker_urls(urls)
        return value

    def urls(self) -> list[str]:
        """The broker URLs, one per node (``["auto"]`` for auto)."""
        return ["auto"] if self.url == "auto" else broker_url_list(self.url)


class HttpSettings(Section):
    """Where the HTTP API listens, and the address other processes use to reach it."""

    host: str = Field("127.0.0.1", description="listen address (`0.0.0.0` in containers)")
    port: int = Field(8000, ge=0, le=65535, description="listen port (`--port` overrides)")
    public_url: str | None = Field(
        None,
        description=(
            "how other processes reach this one; a replica sharing the learner's config (where "
            "this names the learner) pulls large snapshots from it unless `weights.pull_url` is set"
        ),
        json_schema_extra={"unset": "`http://<host>:<port>`"},
    )
    token: SecretStr | None = Field(
        None,
        description=(
            "bearer token: required on `GET /v1/models/<name>/weights` (replicas send it when "
            "pulling) and on `POST /v1/models/<name>/labels` (a label trains the model); prefer "
            "`LIVEFIT_HTTP__TOKEN`; never logged"
        ),
    )
    admin_token: SecretStr | None = Field(
        None,
        description=(
            "bearer token of the admin routes (`/v1/admin/...`: move labels, pin, roll back; "
            "`livefit versions`), apart from `http.token` so that who may download weights or "
            "send labels may not choose what is served. Unset: the admin routes answer 403, "
            "whatever is sent. Prefer `LIVEFIT_HTTP__ADMIN_TOKEN`; never logged"
        ),
    )
    protect_predictions: bool = Field(
        False,
        description=(
            "require the token on prediction and model endpoints too (health and `/metrics` stay "
            "open for probes and scrapers)"
        ),
    )
    body_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a request body that has not fully arrived by then gets 408",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description=(
            "a request head (request line and headers) must arrive within this long of the "
            "connection opening, or of the first byte of a later request on it; a partial head "
            "then gets 408 and the connection is closed, a connection that sent nothing is closed. "
            "uvicorn has no such timeout (see [Connections](http.md#connections))"
        ),
    )
    keep_alive_timeout_s: float = Field(
        5.0,
        gt=0,
        description="an idle connection between requests is closed after this long",
    )
    max_connections: int = Field(
        1000,
        ge=16,
        description=(
            "open connections at most (lowered to the open-file limit less 128, with a warning); "
            "at the cap a new connection takes the place of the oldest one with no request in "
            "progress, and is answered 503 (`Retry-After: 1`) and closed only when every "
            "connection has one"
        ),
    )
    max_header_bytes: int = Field(
        65536,
        ge=1024,
        description="a larger request head gets 431 and the connection is closed",
    )
    workers: int | None = Field(
        None,
        ge=0,
        le=64,
        description=(
            "serving processes behind `http.port` (`--workers`); the parent binds the port and "
            "supervises them, the kernel gives each new connection to one of them; each process's "
            'log lines carry `[worker i]` (`"worker": i` in JSON logs), a split learner\'s '
            "training process `[training]`. `livefit replica`: N whole replicas (unset, 0 or 1: "
            "one process). `livefit serve`: N ≥ 1, a training process and N serving processes (the "
            "learner split; see [Processes](design.md#processes)); unset, the same with one "
            "serving process per usable core beside the training process's (the CPUs of its "
            "affinity mask, capped by a cgroup CPU quota), at least 1 and at most 4 (each is a "
            "TensorFlow process of its own: about 300 MB PSS); 0, the whole learner in one "
            "process, predictions served beside training. On 2 cores the split at 1 serving "
            "process answers more, keeps a lower p99 while training and trains more than one "
            "process, for a second TensorFlow process's memory and a slower start "
            "([workers](../BENCHMARKS.md#serving-workers-replica-and-learner---"
            "workers-n-against-the-http-ceiling)). "
            "On 1 core it is still 1 serving process (not benchmarked there; `--workers 0` if "
            "memory is short). "
            "`tests/unit/config/test_machine.py` checks the count"
        ),
        json_schema_extra={
            "unset": (
                "`serve`: one serving process per usable core beside training's, 1 to 4; "
                "`replica`: one process"
            ),
        },
    )
    worker_timeout_s: float = Field(
        30.0,
        ge=0,
        description=(
            "a process of a group (`http.workers` above: a replica group's serving processes, a "
            "split learner's serving and training processes) that has not run for this long "
            "(SIGSTOPped, or wedged) is SIGKILLed by the parent and started again, as gunicorn's "
            "`--timeout` does: each serving process's event loop touches a file in the group's "
            "private directory every second (the training process's main thread every 0.5 s, with "
            "its status), and the parent kills a process whose file has not changed for that long "
            "by the parent's own monotonic clock (so a wall clock stepped forward, or a machine "
            "resumed from suspend, is not taken for silence). 0 turns it off; otherwise at least 3 "
            "(a serving process beats once a second; a shorter timeout is refused at load, since "
            "it would kill processes that run). Tested in `test_learner_group.py` (at 3 s: SIGSTOP "
            "of a serving process, then of the training process: each killed and started again, "
            "both serve, every sample trained) and `test_heartbeat.py`"
        ),
    )

    @field_validator("public_url")
    @classmethod
    def _public_url_without_credentials(cls, value: str | None) -> str | None:
        # A replica sharing this config pulls from it and logs it as its pull origin.
        return without_credentials(value, "http.token")

    @field_validator("worker_timeout_s")
    @classmethod
    def _worker_timeout_beats(cls, value: float) -> float:
        if 0 < value < MIN_WORKER_TIMEOUT_S:
            raise ValueError(
                f"must be 0 (off) or at least {MIN_WORKER_TIMEOUT_S:g} s: a serving process "
                "beats once a second"
            )
        return value

    def replica_workers(self) -> int:
        return max(1, self.workers or 1)

    def learner_workers(self) -> int:
        """Serving processes of ``livefit serve`` (0: none, the learner in one process)."""
        if self.workers is not None:
            return self.workers
        return default_serving_processes()

    def token_bytes(self) -> bytes | None:
        return self.token.get_secret_value().encode() if self.token else None

    def admin_token_bytes(self) -> bytes | None:
        return self.admin_token.get_secret_value().encode() if self.admin_token else None

    def base_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"


class StorageSettings(Section):
    """Where and how livefit keeps state: write-ahead log, checkpoints, broker persistence."""

    dir: str = Field(
        "./livefit-data",
        description=(
            "state: write-ahead log (`wal/`), checkpoints (`checkpoints/<model>/`), the "
            "persistence of a mosquitto livefit starts"
        ),
    )
    wal: bool = Field(
        True,
        description=(
            "acknowledge a sample message only once it is in the write-ahead log (see "
            "[guarantees](guarantees.md))"
        ),
    )
    fsync: bool = Field(
        True,
        description=(
            "fsync each log commit and checkpoint (survives power loss, not only process crashes)"
        ),
    )
    wal_segment_bytes: int = Field(
        64 * 1024 * 1024,
        ge=4096,
        description=(
            "log segment size; whole segments are deleted once every model's previous checkpoint "
            "(the one a corrupt newest checkpoint falls back to) is past them"
        ),
    )
    wal_group_max: int = Field(
        1000,
        ge=1,
        description="messages committed (one fsync) and acknowledged together at most",
    )
    wal_commit_window_ms: float = Field(
        1.0,
        ge=0,
        le=1000,
        description=(
            "once the inbox is empty, a commit waits up to this long for more messages, so one "
            "fsync covers them (it was one fsync per message or two at a few thousand messages/s); "
            "it adds at most this much to a message's acknowledgement and freshness; `0`: commit "
            "at once"
        ),
    )


class LoggingSettings(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO",
        description=(
            "`DEBUG`, `INFO`, `WARNING`, `ERROR`. At `INFO` the learner logs the first weights it "
            "publishes and then one line per 30 s per model (how many versions, which range), and "
            "a replica likewise for the versions it serves; `DEBUG` adds a line per version"
        ),
    )
    json_format: bool = Field(False, alias="json", description="one JSON object per log line")

    model_config = ConfigDict(extra="forbid", populate_by_name=True, coerce_numbers_to_str=True)


DEVICE_NAME = re.compile(r"^(?:/device:|/)?(CPU|GPU):(\d+)$", re.IGNORECASE)


class TensorFlowSettings(Section):
    """TensorFlow's thread pools (0: TensorFlow's default, one thread per core) and the devices
    the trainers train on, for the whole process. Fewer intra-op threads leave cores to the
    event loop when one process both trains and serves on a small machine."""

    intra_op_threads: int = Field(
        0,
        ge=0,
        le=1024,
        description=(
            "threads one TensorFlow op may use, for the whole process (`0`: TensorFlow's default, "
            "one per core)"
        ),
    )
    # why: 0 lets a split learner's training process take 1 (BENCHMARKS.md#trainer-throughput)
    inter_op_threads: int = Field(
        0,
        ge=0,
        le=1024,
        description=(
            "ops TensorFlow runs at once (`0`: its default, one per core; a split learner's "
            "training process that trains one model on the CPU then takes 1: it serves nothing, "
            "and idle pool threads would take the cores its trainer needs: "
            "[trainer](../BENCHMARKS.md#trainer-throughput))"
        ),
    )
    devices: Literal["auto"] | list[str] = Field(
        "auto",
        description=(
            "the devices each trainer trains on, mirrored (`tf.distribute.MirroredStrategy`: each "
            'batch split across them, gradients summed): `"auto"` is every visible GPU where '
            'there are two or more, else the model\'s `device`; or a list such as `["GPU:0", '
            '"GPU:1"]`. A model whose `device` is not `"auto"` trains on that one device; '
            "serving stays on one device. A listed device TensorFlow does not see stops `livefit "
            "serve` (exit 2; a replica never trains and ignores it). See "
            "[operations](operations.md#several-devices)"
        ),
    )
    logical_cpu_devices: int = Field(
        0,
        ge=0,
        le=64,
        description=(
            "split the CPU into this many logical devices (`CPU:0` .. `CPU:n-1`) before TensorFlow "
            "starts, to try and test the several-device path without GPUs (`0`: do not split); "
            "name them in `devices` to use them. Not faster: they share the same cores"
        ),
    )

    @field_validator("devices")
    @classmethod
    def _check_devices(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, str):
            return value
        if not value:
            raise ValueError('name at least one device, or "auto"')
        names = []
        for name in value:
            match = DEVICE_NAME.match(name.strip())
            if match is None:
                raise ValueError(f"{name!r} is not a device name: CPU:<n> or GPU:<n>")
            names.append(f"/{match[1].upper()}:{int(match[2])}")
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"{', '.join(duplicates)} named more than once")
        return names


class ProcessSettings(Section):
    """Operating-system settings of a split learner's processes (``http.workers`` >= 1) and,
    for ``preload``, of a replica's workers."""

    # why 0: at 10 training starved (BENCHMARKS.md#interference-predictions-while-training)
    training_niceness: int = Field(
        0,
        ge=0,
        le=19,
        description=(
            "a split learner (`http.workers` ≥ 1): added to the niceness of the training process's "
            "threads that train (ingestion, trainers, TensorFlow's pools, checkpoint and weight "
            "writers; not its main thread, which sends its status and answers its metrics), so "
            "that when training and serving both want the cores the kernel gives them to the "
            "serving processes first. Not the default: at 10 serving gains a little, and training "
            "starves whenever anything else saturates the machine "
            "([interference](../BENCHMARKS.md#interference-predictions-while-training))"
        ),
    )
    # why: "auto" leaves serving a core (BENCHMARKS.md#interference-predictions-while-training)
    training_cores: Literal["auto"] | int = Field(
        "auto",
        description=(
            "a split learner (`http.workers` ≥ 1): the CPUs its training process runs on (every "
            'thread of it but the one that forks a broker it starts). `"auto"`: the usable cores '
            "less one per serving process, at least 1 (1 of 2 cores, 4 of 8 with 4 serving "
            "processes); N: N cores; 0: every core (before issue #29). It takes the "
            "highest-numbered cores of the process's CPU mask and sizes TensorFlow's intra-op pool "
            "to them unless `tensorflow.intra_op_threads` is set; the serving processes keep every "
            "core, so queued predictions find a core training cannot take (unless "
            '`processes.serving_cores` is "others"; '
            "[interference](../BENCHMARKS.md#interference-predictions-while-training))"
        ),
    )
    # why "all": "others" was never better (BENCHMARKS.md#interference-predictions-while-training)
    serving_cores: Literal["all", "others"] = Field(
        "all",
        description=(
            'a split learner: the CPUs its serving processes run on. `"all"`: every core, the '
            'training process\'s too; `"others"`: the cores `processes.training_cores` leaves '
            "(every core when training is not pinned), so a saturated training process never "
            "shares a core with an event loop, at the cost of the serving processes never using "
            "the training cores when training is idle. Set before any thread starts. Not the "
            "default: on 2 cores it served more requests under load, never with a better p99 "
            "([interference](../BENCHMARKS.md#interference-predictions-while-training))"
        ),
    )

    preload: bool = Field(
        True,
        description=(
            "a split learner's processes (`http.workers` ≥ 1) and a replica's workers (2 or "
            "more): fork them from one process of the group (`livefit-fork`) that imported "
            "TensorFlow, Keras and livefit once, like gunicorn's `--preload`, so that a process "
            "starts and restarts without that import and shares those pages with its siblings; "
            "a process's command line is then the fork server's, its role in `ps -o comm` "
            "(`livefit-train`, `livefit-w0`...). false: each starts as its own `python -m "
            "livefit` ([preloaded processes](design.md#preloaded-processes))"
        ),
    )

    @field_validator("training_cores")
    @classmethod
    def _cores_known(cls, value: Literal["auto"] | int) -> Literal["auto"] | int:
        if isinstance(value, int) and not 0 <= value <= 4096:
            raise ValueError('must be "auto", 0 (every core) or a number of cores up to 4096')
        return value
