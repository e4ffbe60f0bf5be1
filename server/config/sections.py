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
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from .broker_urls import broker_url_list, hide_credentials, parse_broker_urls
from .machine import default_serving_processes

MIN_WORKER_TIMEOUT_S = 3.0  # http.worker_timeout_s: three heartbeats (server/base/heartbeat.py)


def without_credentials(url: str | None, secret_setting: str) -> str | None:
    """``url`` unchanged, or ValueError if it carries a user or password: livefit logs the HTTP
    URLs it pulls from, so a secret goes in ``secret_setting`` (a header), never in the URL."""
    if url is not None and "@" in url.split("://", 1)[-1].split("/", 1)[0]:
        raise ValueError(f"no user or password in the URL (it is logged): set {secret_setting}")
    return url


class Section(BaseModel):
    # Numbers become strings where a string is expected: LIVEFIT_..._HMAC_KEY=123456 is a key.
    model_config = ConfigDict(extra="forbid", validate_default=True, coerce_numbers_to_str=True)


class TlsSettings(Section):
    """TLS material for ``mqtts://`` brokers (all paths are PEM files)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False  # skip hostname verification: for test CAs only


class BrokerSettings(Section):
    """How livefit reaches its MQTT broker."""

    # "auto", one URL, or a cluster's nodes: a list of URLs or one string of URLs separated by
    # commas (an environment variable); clients fail over between them (server/mqtt/failover.py).
    url: str | list[str] = "auto"
    client_id: str = "livefit-learner"
    protocol: Literal["5", "3.1.1"] = "5"
    keepalive_s: int = Field(30, ge=5, le=3600)
    session_expiry_s: int = Field(86400, ge=0)
    receive_maximum: int = Field(1000, ge=1, le=65535)
    reconnect_min_s: float = Field(0.5, gt=0)
    reconnect_max_s: float = Field(5.0, gt=0)
    connect_timeout_s: float = Field(10.0, gt=0)
    # No PUBLISH larger than this is sent (it is counted as refused); the broker's own limit,
    # sent in an MQTT 5 CONNACK, applies too. Set it for an MQTT 3.1.1 broker with a limit
    # (mosquitto max_packet_size, AWS IoT Core 128 KB): a larger packet makes the broker drop
    # the connection. A snapshot over it is announced by a manifest and pulled over HTTP.
    max_packet_size_bytes: int | None = Field(None, ge=1024)
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

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    public_url: str | None = None  # default http://<host>:<port>; replicas sharing it pull here
    token: SecretStr | None = None  # bearer token: HTTP labels, weight downloads (and predictions)
    protect_predictions: bool = False  # require the token on prediction and model endpoints
    body_timeout_s: float = Field(10.0, gt=0)  # a request body must arrive within this
    # Connection limits (server/http/connections.py): a request head must arrive within
    # header_timeout_s (of the connection opening, or of a later request's first byte), an idle
    # connection is closed after keep_alive_timeout_s, a head over max_header_bytes gets 431,
    # and at most max_connections are open (the oldest idle or head-sending one makes room).
    header_timeout_s: float = Field(10.0, gt=0)
    keep_alive_timeout_s: float = Field(5.0, gt=0)
    max_connections: int = Field(1000, ge=16)
    max_header_bytes: int = Field(65536, ge=1024)
    # Processes answering HTTP on http.port. `livefit replica`: that many whole replicas
    # (server/runtime/workers.py; unset, 0 and 1 all mean one process). `livefit serve`:
    # N >= 1 splits the learner into a training process and N serving processes
    # (server/runtime/learner_group.py); unset, the same with one serving process per usable
    # core beside training's, 1 to 4 (server/config/machine.py); 0 keeps the whole learner
    # in one process, predictions served beside training.
    workers: int | None = Field(None, ge=0, le=64)
    # A process of a group (above: a serving process, a split learner's training process) that
    # has not beaten for this long (SIGSTOPped, or wedged: a serving process's event loop, the
    # training process's main thread) is SIGKILLed and started again (server/base/heartbeat.py);
    # 0 turns the check off; otherwise at least MIN_WORKER_TIMEOUT_S (a serving process beats
    # every second: below a few beats the check kills processes that run).
    worker_timeout_s: float = Field(30.0, ge=0)

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

    def base_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"


class StorageSettings(Section):
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


class LoggingSettings(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    json_format: bool = Field(False, alias="json")

    model_config = ConfigDict(extra="forbid", populate_by_name=True, coerce_numbers_to_str=True)


DEVICE_NAME = re.compile(r"^(?:/device:|/)?(CPU|GPU):(\d+)$", re.IGNORECASE)


class TensorFlowSettings(Section):
    """TensorFlow's thread pools (0: TensorFlow's default, one thread per core) and the devices
    the trainers train on, for the whole process. Fewer intra-op threads leave cores to the
    event loop when one process both trains and serves on a small machine."""

    intra_op_threads: int = Field(0, ge=0, le=1024)
    # 0: TensorFlow's default, except in a split learner's training process that trains one
    # model on the CPU, which takes 1 (``training_process.TRAINING_INTER_OP_THREADS``: measured
    # faster there)
    inter_op_threads: int = Field(0, ge=0, le=1024)
    # The devices each trainer trains on, mirrored (tf.distribute.MirroredStrategy: every
    # batch split across them, gradients summed): "auto" is every visible GPU where there are
    # two or more, else the model's own `device`; or a list such as ["GPU:0", "GPU:1"]. A
    # model whose `device` is not "auto" trains on that one device. Serving stays on one
    # device (the model's `device`). A named device TensorFlow does not see stops a learner.
    devices: Literal["auto"] | list[str] = "auto"
    # Split the CPU into this many logical devices (CPU:0 .. CPU:n-1) before TensorFlow starts,
    # to try and test the several-device path without GPUs (0: do not split). On its own it
    # changes nothing: name the devices in `devices`. Not faster: the CPU's cores are shared.
    logical_cpu_devices: int = Field(0, ge=0, le=64)

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
    """Operating-system settings of a split learner's processes (``http.workers`` >= 1)."""

    # Added to the niceness of the training process's threads that train (ingestion, trainers,
    # TensorFlow's pools; not the main thread's status and metrics answers). When training and
    # serving both want the cores, the kernel gives them to the serving processes first; an
    # idle machine still trains at full speed. Default 0 (equal shares): at 10 the training
    # threads starved whenever anything else saturated the machine (BENCHMARKS "interference").
    training_niceness: int = Field(0, ge=0, le=19)
    # The CPUs the training process runs on (every thread of it: ingestion, trainers,
    # TensorFlow's pools, whose intra-op pool is sized to match unless
    # `tensorflow.intra_op_threads` is set). "auto": the usable cores less one per serving
    # process, at least 1 (1 of 2 cores; 4 of 8 with the default 4 serving processes); N: N
    # cores; 0: every core (before issue #29). The training process gets the highest-numbered
    # cores; the serving processes may run on every core, so while requests queue they have the
    # cores training may not take (BENCHMARKS.md "interference").
    training_cores: Literal["auto"] | int = Field("auto")
    # The CPUs the serving processes run on. "all": every core, the training process's too;
    # "others": the cores `training_cores` leaves (every core when training is not pinned), so
    # a busy training process never shares a core with an event loop. Measured side by side in
    # BENCHMARKS.md "interference": on 2 cores "others" served more requests under load but
    # with the worst p99 on one host (6.95x idle against 2.86x, 2026-11-26), the load client
    # then sharing the serving core, and level on another (3.04x against 3.02x, 2026-11-27);
    # never better, so "all" by default.
    serving_cores: Literal["all", "others"] = Field("all")

    @field_validator("training_cores")
    @classmethod
    def _cores_known(cls, value: Literal["auto"] | int) -> Literal["auto"] | int:
        if isinstance(value, int) and not 0 <= value <= 4096:
            raise ValueError('must be "auto", 0 (every core) or a number of cores up to 4096')
        return value
