"""A model's sub-tables: ``[models.<name>.train]`` (minibatches and the update policy),
``.drift``, ``.serve`` (request batching, admission and limits), ``.weights`` (the weight
stream, signing and verification), ``.checkpoint``, ``.labels`` (delayed labels) and
``.experts`` (the linear expert and the mixture).

This module owns those tables; ``config.model`` puts them in ``ModelSettings`` and ``config``
re-exports them.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from livefit.models import names

from .sections import Section, without_credentials
from .topic_filters import checked_topic


class TrainSettings(Section):
    """How the trainer forms minibatches from the sample queue."""

    max_batch_size: int = Field(256, ge=1, le=65536)
    max_wait_ms: float = Field(0.0, ge=0, le=60_000)
    queue_capacity: int = Field(20_000, ge=1)  # samples held between ingestion and training
    # The update policy (defaults measured by the learning-quality benchmark, BENCHMARKS.md):
    # Gradient steps on each minibatch (see extras_when). Unset: 4 for regression losses (mse,
    # mae, huber, log_cosh), 2 for the others (ModelSettings.resolved_steps_per_batch).
    # Measured in-process over 15 streams and 4 model seeds (BENCHMARKS.md, learning quality):
    # 3 and 4 steps lowered the MAE on all five regression streams, mean and worst seed (2.4
    # to 19 %); on the classifiers 3 steps won on five streams and lost on four (up to 0.6
    # points), 4 steps lost more.
    steps_per_batch: int | None = Field(None, ge=1, le=100)
    # Samples kept for replay (0: no replay). Unset: 2,000 for regression losses, 500 for the
    # others, fewer where that many would take more than 256 MiB
    # (ModelSettings.resolved_replay_capacity). Memory is the capacity times one sample's size.
    # Measured in-process over the five regression streams and 4 model seeds (BENCHMARKS.md,
    # learning quality), with 4 steps: 1,000, 2,000 and 4,000 samples each lowered the MAE on
    # three streams and left TrumpApproval and ChickWeights (1,001 and 578 samples) level; on
    # the binary streams windows longer than 500 lost on Hyperplane and SEA.
    replay_capacity: int | None = Field(None, ge=0)
    replay_mode: Literal["reservoir", "window"] = "window"
    replay_share: float = Field(0.75, ge=0, lt=1)  # share of replayed samples in each step
    # "caught_up": steps beyond the first and replayed samples only for a batch that took every
    # queued sample, while no prediction request waits (the trainer keeps up, so the extra work
    # uses time it would spend waiting); otherwise one plain step. "always": every batch.
    extras_when: Literal["caught_up", "always"] = "caught_up"
    # Before each step, wait up to this long while prediction requests are queued (0: never).
    yield_to_serving_ms: float = Field(2.0, ge=0, le=1000)
    # Start a plain batch's step (taken from a backlog: one step on its own samples) while the
    # step before it still runs, so the trainer's bookkeeping (scores, drift test, scaling,
    # metrics) overlaps TensorFlow's work instead of following it; where the step before did
    # not apply or brought a drift reaction, the early step is rewound and run again, so the
    # result is the same. "auto": on where the trainer's process may use 2 or more CPUs (the
    # overlap needs a second one), with one device and model selection off; "on" (still off
    # for several devices and with selection), "off".
    pipeline: Literal["auto", "on", "off"] = "auto"
    # With target scaling: a target more than this many standard deviations from the running
    # mean of the targets (from the 10th target on; widened by 100 / count below 100 targets)
    # is an outlier, clipped to that bound before it enters the statistics, trained with weight
    # 0, and counted (0: no bound).
    target_outlier_std: float = Field(8.0, ge=0, allow_inf_nan=False)
    # A fast start: the first start_steps training steps of a fresh model (not one restored
    # from a checkpoint) run at start_lr_factor times the learning rate, decaying linearly to
    # the configured rate (1: no start boost, the behaviour before it existed). 2 over 300:
    # measured over 15 streams (BENCHMARKS.md, learning quality), the safest of 3x over 100
    # and 300 steps and 5x over 200 (those gained more on some streams and lost up to 2 to
    # 13 % MAE on the regression ones).
    start_lr_factor: float = Field(2.0, ge=1, le=100, allow_inf_nan=False)
    # A model takes batches no larger than the samples it has learned so far (at least 5: 5,
    # 5, 10, 20, ...) until it has learned this many (0: no such start). The count is the
    # model's own and checkpoints keep it: a restored model goes on where it stopped. Each
    # batch is scored before it is learned, so the first message is no longer all predicted
    # by the untrained weights. Unset: 100 for regression losses, 0 for the others
    # (ModelSettings.resolved_fast_start_samples). Measured over 15 streams and 4 model seeds
    # with messages of 25 (BENCHMARKS.md, learning quality, "A fast start by batch size"):
    # after the first message, what the clients are served, it lowered the MAE on all five
    # regression streams on the mean over seeds (0.03 to 3.7 %; some seeds were worse on
    # four of them) and lowered the accuracy on eight of the ten classification streams
    # (Phishing on every seed, 0.69 points on the mean; Sine by 0.01; Waveform gained 0.23).
    fast_start_samples: int | None = Field(None, ge=0, le=1_000_000)
    start_steps: int = Field(300, ge=1, le=1_000_000)
    # Weight averaging: the trainer also keeps an exponential moving average of the trained
    # weights, this decay per step (0: none), and serves it (snapshots, the weight topic, the
    # prequential scores) while its prequential loss over the last 500 samples is the lower
    # of the two. 0.95, measured over 15 streams and 4 model seeds (BENCHMARKS.md, learning
    # quality): 1 point more accuracy on the noisy Waveform and LED, 3 to 5 % lower MAE on
    # Friedman, Planes2D and Mv; always serving the average cost up to 6 points on Moving RBF.
    weight_average: float = Field(0.95, ge=0, lt=1, allow_inf_nan=False)

    @field_validator("target_outlier_std", mode="before")
    @classmethod
    def _no_boolean(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("must be a number of standard deviations (0: no bound), not a boolean")
        return value

    @field_validator("target_outlier_std")
    @classmethod
    def _check_outlier_bound(cls, value: float) -> float:
        # Below 1 standard deviation the bound would clip a good share of a steady stream's
        # targets (a third of a normal one), bias the statistics it is computed from, and its
        # runs beyond the bound would pass for changes of level.
        if 0 < value < 1:
            raise ValueError("must be 0 (no bound) or at least 1 (standard deviations)")
        return value


class DriftSettings(Section):
    """Drift detection on the prequential loss, and what to do when it fires."""

    enabled: bool = True  # detect, count and report drift (a cheap test on the losses)
    method: Literal["page_hinkley", "adwin"] = "page_hinkley"
    threshold: float = Field(50.0, gt=0)  # Page-Hinkley lambda, in standardised loss units
    # "none": log and count only; "reset_optimizer": a fresh optimizer state (the learning rate
    # kept); "boost_lr":
    # boost_factor times the learning rate for boost_steps steps, then back at once;
    # "flush_replay": empty the replay buffer (it holds the old concept); "recover": empty the
    # replay buffer and boost the learning rate by boost_factor, decaying linearly to the
    # configured rate over boost_steps steps. Default flush_replay: measured best of the five
    # over 15 streams and model seeds 1-3 (BENCHMARKS.md, learning quality); the learning-rate
    # boosts cost up to 11 % MAE on the regression streams, none and reset_optimizer recover
    # slower.
    reaction: Literal["none", "reset_optimizer", "boost_lr", "flush_replay", "recover"] = (
        "flush_replay"
    )
    boost_factor: float = Field(3.0, gt=1, le=100)  # learning rate multiplier (boost_lr, recover)
    boost_steps: int = Field(200, ge=1)  # training steps the boost lasts
    events_topic: str | None = None  # default livefit/<name>/events

    @field_validator("events_topic")
    @classmethod
    def _check_events_topic(cls, value: str | None) -> str | None:
        return checked_topic(value)


_CANDIDATE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CONFIGURED_CANDIDATE = "configured"  # the model's own settings, always a candidate


class CandidateSettings(Section):
    """One more candidate for a model's online selection: the configured network trained
    with another optimizer, learning rate or seed (unset: the model's own)."""

    name: str
    optimizer: str | None = None
    learning_rate: float | None = Field(None, gt=0, allow_inf_nan=False)
    seed: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _same_architecture(cls, value: Any) -> Any:
        if isinstance(value, dict):
            other = sorted(k for k in ("builder", "builder_options") if k in value)
            if other:
                raise ValueError(
                    f"{', '.join(other)}: a candidate shares the configured network's "
                    "architecture (replicas serve every candidate's weights with the network "
                    "they build from the config); it may change optimizer, learning_rate and "
                    "seed"
                )
        return value

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _CANDIDATE_NAME.match(value):
            raise ValueError(f"candidate name {value!r}: 1 to 64 of A-Z a-z 0-9 _ -")
        if value == CONFIGURED_CANDIDATE:
            raise ValueError(
                f"{CONFIGURED_CANDIDATE!r} names the model's own settings, always a candidate"
            )
        return value

    @field_validator("optimizer")
    @classmethod
    def _check_optimizer(cls, value: str | None) -> str | None:
        if value is not None:
            names.check_optimizer(value)
        return value


class SelectionSettings(Section):
    """Online model selection: candidates trained side by side on the same minibatches, the
    served one chosen by its recent prequential loss."""

    enabled: bool = False
    candidates: list[CandidateSettings] = Field(default_factory=list)
    window: int = Field(500, ge=10, le=1_000_000)  # samples each candidate's loss averages over
    # A challenger is served once its windowed loss is below (1 - margin) times the served
    # one's, and at least min_samples_between_switches samples after the last switch.
    # Measured against 200, 0.02 and 100 on the 15 learning streams over 4 seeds (BENCHMARKS.md,
    # "Online model selection remeasured"): the shorter window gained on the mean only through
    # the two Agrawal concept switches and lost on the other streams, with ten times the
    # switches, so these stay.
    margin: float = Field(0.05, ge=0, lt=1, allow_inf_nan=False)
    min_samples_between_switches: int = Field(500, ge=0)

    @model_validator(mode="after")
    def _check_candidates(self) -> SelectionSettings:
        seen = [c.name for c in self.candidates]
        twice = sorted({n for n in seen if seen.count(n) > 1})
        if twice:
            raise ValueError(f"candidate names must differ: {', '.join(twice)} given twice")
        if self.enabled and not self.candidates:
            raise ValueError("enabled needs at least one entry in candidates")
        return self


class ServeSettings(Section):
    """Request batching and limits for the prediction API."""

    max_batch_size: int = Field(64, ge=1, le=65536)
    # 0: a batch fires as soon as the model is free, with every request queued by then (they
    # queue while the previous batch runs). Measured: 3.3x the requests/s of 2 ms at 1 client,
    # the same or better at 64 (BENCHMARKS.md); Triton's default is also 0. "auto": chosen
    # per batch from the measured arrival rate and batch cost (0 unless waiting lowers the mean
    # latency; server/serve/batch_cost.py AutoTimeout), at most max_batch_timeout_ms. Not the
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
    # What computes a batch (server/serve/runtimes.py): "keras" the Keras model traced by
    # tf.function (TensorFlow's graph executor, every model); "xla" the same compiled by XLA
    # per padded batch size; "numpy" a NumPy forward pass of a chain of Dense-type layers
    # (linear, mlp), the same float32 math. "auto": numpy where the model is such a chain (on
    # a CPU), else keras; a runtime that cannot take the model falls back to keras with one
    # log line. Measured per 1-row call (bench/prose/runtimes.md): 64x64 MLP keras 230-300 us,
    # xla ~130 us, numpy ~11 us; LSTM keras 470-620 us, xla ~156 us, but xla's gain did not
    # hold end to end over HTTP and it compiles for seconds at start: opt-in.
    runtime: Literal["auto", "keras", "xla", "numpy"] = "auto"

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


class WeightsSettings(Section):
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
    # Replicas: the bearer token sent with pulls from pull_url (that learner's http.token);
    # default this process's http.token. Per model, so one replica can follow learners whose
    # tokens differ.
    pull_token: SecretStr | None = None
    pull_timeout_s: float = Field(30.0, gt=0)
    max_pull_bytes: int = Field(256 * 1024 * 1024, ge=1024)  # a pulled payload larger: refused
    max_age_s: float = Field(86400.0, ge=0)  # refuse weights signed longer ago (0: no limit)
    refresh_interval_s: float = Field(3600.0, gt=0)  # learner re-signs its newest snapshot
    # Replicas (and a split learner's serving processes): readiness fails once every weight
    # message has been refused for this long since the last one that verified (0: never).
    refused_unready_s: float = Field(60.0, ge=0)

    @field_validator("topic")
    @classmethod
    def _check_topic(cls, value: str | None) -> str | None:
        return checked_topic(value)

    @field_validator("pull_url")
    @classmethod
    def _check_pull_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/?#]+(/[^?#]*)?$", value):
            raise ValueError("must be the learner's base URL, http(s)://host:port")
        without_credentials(value, "weights.pull_token")
        return value.rstrip("/") if value else value

    @field_validator("pull_token")
    @classmethod
    def _check_pull_token(cls, value: SecretStr | None) -> SecretStr | None:
        # It goes into an HTTP header: refuse here what httpx would refuse at the first pull.
        if value is not None and not re.fullmatch(r"[\x21-\x7e]+", value.get_secret_value()):
            raise ValueError("must be a bearer token: printable ASCII, no spaces, not empty")
        return value

    @model_validator(mode="after")
    def _check_verify_key(self) -> WeightsSettings:
        if self.verify_key and self.verify_key_file:
            raise ValueError("set verify_key or verify_key_file, not both")
        return self

    def key_bytes(self) -> bytes | None:
        return self.hmac_key.get_secret_value().encode() if self.hmac_key else None

    def pull_token_bytes(self) -> bytes | None:
        return self.pull_token.get_secret_value().encode() if self.pull_token else None


class ExpertsSettings(Section):
    """Experts trained in one step beside the configured network, mixed by their recent errors
    (docs/design.md, "Experts")."""

    enabled: bool = Field(
        True,
        description=(
            "train a linear model beside the configured network, in the same compiled step, on "
            "the same samples, and serve their mixture, weighed by each one's recent prequential "
            "error (Hedge). Built for the losses livefit knows the kind of (binary, categorical, "
            "sparse categorical, mse, mae, huber, log-cosh); off for the others. Part of the "
            "architecture: learner and replicas must agree"
        ),
    )
    decay: float = Field(
        0.998,
        gt=0,
        lt=1,
        allow_inf_nan=False,
        description=(
            "per sample: an error n samples ago counts decay**n in an expert's recent error "
            "(0.998: about the last 500 samples), so the mixture follows a drift"
        ),
    )
    rate: float = Field(
        1.0,
        gt=0,
        le=1000,
        allow_inf_nan=False,
        description=(
            "Hedge's rate: an expert's share is proportional to exp(-rate * its recent error), "
            "counted in wrong predictions for a classifier and in standardized absolute errors "
            "(the targets' units without target scaling) otherwise"
        ),
    )
    linear_learning_rate: float = Field(
        0.01,
        gt=0,
        le=10,
        allow_inf_nan=False,
        description=(
            "the linear expert's plain SGD rate per sample, as River's linear models learn "
            "(capped at 1 / the number of input features, where LMS stays stable)"
        ),
    )
    linear_rows: int = Field(
        32,
        ge=1,
        le=65536,
        description=(
            "a batch of up to this many new samples moves the linear expert as far as that many "
            "per-sample steps would (the sum of their gradients); a larger batch (a backlog) as "
            "far as this many"
        ),
    )


class CheckpointSettings(Section):
    """How often a model's training state is saved (and at shutdown)."""

    interval_s: float = Field(30.0, gt=0)
    keep: int = Field(3, ge=1, le=1000)


class LabelsSettings(Section):
    """Delayed labels (README "Delayed labels"): how long a prediction waits for its label."""

    ttl_s: float = Field(3600.0, gt=0)  # a prediction (or early label) waits this long at most
    max_pending: int = Field(100_000, ge=1, le=10_000_000)  # predictions waiting, at most
    on_expiry: Literal["drop", "default"] = "drop"  # "default": learn default_y instead
    default_y: float | list[Any] | None = None  # the label learned on expiry (target-shaped)
    tick_s: float = Field(1.0, gt=0, le=3600)  # how often the learner checks for expiry
    record_buffer_rows: int = Field(10_000, ge=1)  # serving side: records waiting for the broker
    batch_window_ms: float = Field(
        50.0,
        ge=0,
        le=60_000,
        allow_inf_nan=False,
        description=(
            "how long the trainer waits for more joined labels when every sample it took was "
            "made by the label join and the batch is not full: labels that fall due one by one "
            "are learned as one minibatch, as samples in a message are (0: each as it comes; "
            "train.max_wait_ms where that is longer)"
        ),
    )
    topic: str | None = None  # default livefit/<name>/labels
    predictions_topic: str | None = None  # default livefit/<name>/predictions

    @field_validator("topic", "predictions_topic")
    @classmethod
    def _check_topics(cls, value: str | None) -> str | None:
        return checked_topic(value)  # replicas publish on them; the learner reads them

    @model_validator(mode="after")
    def _check_default(self) -> LabelsSettings:
        if self.on_expiry == "default" and self.default_y is None:
            raise ValueError('on_expiry = "default" needs default_y, the label to learn')
        return self
