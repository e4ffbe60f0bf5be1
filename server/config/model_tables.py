"""A model's sub-tables: ``[models.<name>.train]`` (minibatches and the update policy),
``.drift``, ``.serve`` (request batching, admission and limits), ``.weights`` (the weight
stream, signing and verification), ``.checkpoint``, ``.labels`` (delayed labels),
``.experts`` (the linear expert and the mixture) and ``.versions`` (the past versions serving
keeps).

This module owns those tables; ``config.model`` puts them in ``ModelSettings`` and ``config``
re-exports them.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from livefit.models import names

from .sections import Section, without_credentials
from .topic_filters import PUBLISHED_TOPIC_RULES, checked_topic


class TrainSettings(Section):
    """How the trainer forms minibatches from the sample queue."""

    max_batch_size: int = Field(
        256,
        ge=1,
        le=65536,
        description=(
            "new samples per minibatch at most (the samples the trainer takes from its queue "
            "at once); each gradient step on it adds replayed ones (`replay_share`), so a step "
            "computes on up to max_batch_size / (1 - replay_share) rows"
        ),
    )
    max_wait_ms: float = Field(
        0.0,
        ge=0,
        le=60_000,
        description="linger to fill a batch; 0 = take what has arrived",
    )
    queue_capacity: int = Field(
        20_000,
        ge=1,
        description=(
            "samples held between ingestion and training; when full, ingestion waits and the "
            "broker holds the rest"
        ),
    )
    # why: regression gains from more steps than classification (docs/benchmarks/learning.md)
    steps_per_batch: int | None = Field(
        None,
        ge=1,
        le=100,
        description=(
            "gradient steps on each minibatch (each a version); the default depends on the loss "
            "([learning quality](../BENCHMARKS.md#learning-quality)); see `extras_when`"
        ),
        json_schema_extra={"unset": "4 for `mse`, `mae`, `huber`, `log_cosh`; else 2"},
    )
    # why: regression gains from a longer replay window (docs/benchmarks/learning.md)
    replay_capacity: int | None = Field(
        None,
        ge=0,
        description=(
            "samples kept for replay (0: off); memory is this many samples (the default depends on "
            "the loss: [learning quality](../BENCHMARKS.md#learning-quality))"
        ),
        json_schema_extra={
            "unset": (
                "2000 for `mse`, `mae`, `huber`, `log_cosh`, else 500; fewer where that many "
                "samples would take more than 256 MiB"
            ),
        },
    )
    replay_mode: Literal["reservoir", "window"] = Field(
        "window",
        description=(
            "`window` (the most recent samples) or `reservoir` (a uniform sample of the whole "
            "stream)"
        ),
    )
    replay_share: float = Field(
        0.75,
        ge=0,
        lt=1,
        description=(
            "share of replayed samples in each step (0.75: three replayed samples per new one); "
            "only new samples count in the prequential scores"
        ),
    )
    extras_when: Literal["caught_up", "always"] = Field(
        "caught_up",
        description=(
            "`caught_up`: the steps beyond the first and the replayed samples only for a batch "
            "that took every queued sample, i.e. while the trainer keeps up and would otherwise "
            "wait; a batch taken from a backlog, or while prediction requests wait for the model, "
            "gets one step on its own samples, so a fast stream trains at the plain step's rate "
            "and predictions go first. `always`: every batch. The defaults of these five settings, "
            "with tanh and nadam at 0.01, close the gap to river's per-sample learners "
            "([learning quality](../BENCHMARKS.md#learning-quality))"
        ),
    )
    yield_to_serving_ms: float = Field(
        2.0,
        ge=0,
        le=1000,
        description=(
            "before each step the trainer waits up to this long while prediction requests are "
            "queued, and its thread runs at OS niceness +5, so predictions go first on a small "
            "machine (see BENCHMARKS.md, interference); `0`: never wait, normal priority"
        ),
    )
    pipeline: Literal["auto", "on", "off"] = Field(
        "auto",
        description=(
            "start a plain batch's step (one taken from a backlog: one step on its own samples) "
            "while the step before it still runs, so the trainer's bookkeeping (scores, drift "
            "test, scaling, metrics) overlaps TensorFlow's work; where the step before was rolled "
            "back or brought a drift reaction, the early step is rewound and run again, so the "
            "result is that of one batch after the other (`livefit_train_rewinds_total`; "
            "[design](design.md#the-pipelined-trainer)); faster on 2 or more cores, slower on "
            "one ([trainer](../BENCHMARKS.md#trainer-throughput)). `auto`: on in a "
            "process that may use 2 or more CPUs and serves no predictions (a split learner's "
            "training process with 2 or more training cores); `on`: also in a one-process learner; "
            "`off`. Never with several devices or model selection"
        ),
    )
    target_outlier_std: float = Field(
        8.0,
        ge=0,
        allow_inf_nan=False,
        description=(
            'with `target_scaling = "standardize"`: a target more than this many standard '
            "deviations from the running mean of the targets (from the 10th target on; below 100 "
            "targets the bound is widened by 100 / count, as the start of a stream is often not "
            "like the rest) is an outlier: clipped to that bound before it enters the statistics, "
            "scored against the bound, trained (and replayed) with weight 0, and counted in "
            "`livefit_train_outliers_total` (a warning at most once a minute). One sample then "
            "moves the target mean by at most 8 standard deviations / samples seen, and the "
            "model's weights not at all. A run of them "
            "is not: 20 of the last 32 targets beyond the bound on the same side are a new level, "
            "the target statistics re-centred on them (`livefit_train_target_shifts_total`; see "
            "[guarantees](guarantees.md#one-outlying-target-cannot-break-a-regression-model)). "
            "`0`: no bound (an outlier is taken in as it is; one whose loss in the targets' units "
            "overflows is rolled back and counted as non-finite); otherwise a finite number of at "
            "least 1 (below, the bound would clip a third of a steady normal stream and its runs "
            "would pass for new levels)"
        ),
    )
    # why: 2 over 300 steps was the safest boost (docs/benchmarks/learning.md, "Drift recovery")
    start_lr_factor: float = Field(
        2.0,
        ge=1,
        le=100,
        allow_inf_nan=False,
        description=(
            "fast start: a fresh model's first `start_steps` training steps run at this multiple "
            "of `learning_rate`, decaying linearly to it (a model restored from a checkpoint is "
            "not fresh: no boost). `1`: no start boost (the behaviour before the setting)"
        ),
    )
    # why: it helps regression only (docs/benchmarks/learning.md, "What the fast start buys")
    fast_start_samples: int | None = Field(
        None,
        ge=0,
        le=1_000_000,
        description=(
            "fast start: until a fresh model has learned this many samples, it takes batches no "
            "larger than what it has learned so far and no smaller than 5 (a first message of 25: "
            "5, 5, 10 and 5 samples), each scored before it is learned, so its first message is "
            "not all predicted by the untrained weights; a batch cut short counts as caught up "
            "where a full-size one would have (`extras_when`). The count of samples learned is the "
            "model's own and checkpoints keep it: a model restored before the limit goes on with "
            "it, one restored past it does not start again. `0`: off. The default depends on the "
            "loss: it lowers regression's error, most of all on its first message, but after the "
            "first message it costs most classifiers accuracy, so they start without it "
            "([learning quality](../BENCHMARKS.md#learning-quality))"
        ),
        json_schema_extra={"unset": "100 for `mse`, `mae`, `huber`, `log_cosh`; else 0"},
    )
    start_steps: int = Field(
        300,
        ge=1,
        le=1_000_000,
        description="training steps the start boost takes to decay",
    )
    # why: 0.95 gained more than 0.9 (docs/benchmarks/learning.md, "Weight averaging")
    weight_average: float = Field(
        0.95,
        ge=0,
        lt=1,
        allow_inf_nan=False,
        description=(
            "weight averaging: the trainer also keeps an exponential moving average of the trained "
            "weights, with this decay per training step (debiased at the start: the t-th update "
            "uses min(decay, t / (9 + t))), and scores every batch with both. The averaged weights "
            "are served (snapshots, replicas, the weight topic, and so the prequential scores) "
            "while their prequential loss over the last 500 samples is lower than the trained "
            "weights', else the trained ones; a drift reaction other than `none` restarts the "
            "average; checkpoints keep both and the losses that chose, so a restarted learner "
            "serves what it served at its checkpoint. The two are compared on every sample of a "
            "batch up to 256, on 256 or fewer evenly spaced ones of a larger batch, so the 500 "
            "samples of the comparison can span several batches; every caught-up batch is "
            "compared, and one in 8 of the batches taken from a backlog (the others keep the "
            "choice: like the extra steps and the replay under the default `extras_when`, most of "
            "the comparison is work a trainer behind its stream skips). Costs one more forward "
            "pass per step: over the batch's own samples (not the replayed ones) where the "
            "averaged weights are served, else over the compared ones only, none in a batch not "
            "compared (on several devices, over every row). `0`: no averaging (the behaviour "
            "before the setting). 0.95: it helps the noisy and the regression streams, and serving "
            "the average only while it scores better keeps it from costing the drifting ones "
            "([learning quality](../BENCHMARKS.md#learning-quality))"
        ),
    )

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

    enabled: bool = Field(
        True,
        description=(
            "watch the prequential loss for drift: counted in `livefit_drift_detected_total` and "
            "reported on the events topic"
        ),
    )
    method: Literal["page_hinkley", "adwin"] = Field(
        "page_hinkley",
        description=(
            "`page_hinkley` (built in; on standardised, clipped losses) or `adwin` (needs `pip "
            "install river`)"
        ),
    )
    threshold: float = Field(
        50.0,
        gt=0,
        description=(
            "Page-Hinkley threshold in standardised loss units (lower: faster, more false alarms)"
        ),
    )
    # why: flush_replay recovered best of the five (docs/benchmarks/learning.md)
    reaction: Literal["none", "reset_optimizer", "boost_lr", "flush_replay", "recover"] = Field(
        "flush_replay",
        description=(
            "on drift: `none` (log and count only), `reset_optimizer` (the optimizer state of a "
            "fresh optimizer, learning rate kept), `boost_lr` (`boost_factor` times the learning "
            "rate for `boost_steps` steps, then back at once), `flush_replay` (empty the replay "
            "buffer, which holds the old concept) or `recover` (empty the replay buffer and boost "
            "the learning rate by `boost_factor`, decaying linearly over `boost_steps` steps)"
        ),
    )
    boost_factor: float = Field(
        3.0,
        gt=1,
        le=100,
        description="learning-rate multiplier for `boost_lr` and `recover`",
    )
    boost_steps: int = Field(200, ge=1, description="training steps the boost lasts")
    events_topic: str | None = Field(
        None,
        description=(
            (
                "where drift events go (JSON: `event`, `model`, `detections`, `version`, "
                "`samples_seen`, `reaction`, `time`)"
            )
            + PUBLISHED_TOPIC_RULES
        ),
        json_schema_extra={"unset": "`livefit/<name>/events`"},
    )

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

    enabled: bool = Field(
        False,
        description=(
            "online model selection: the configured model and each of `candidates` train on the "
            "same minibatches; the one with the lowest recent prequential loss is served "
            "(snapshots, weight stream, checkpoints' served copy). Off: its gain did not pay "
            "for its cost ([online model selection](design.md#online-model-selection))"
        ),
    )
    candidates: list[CandidateSettings] = Field(
        default_factory=list,
        description=(
            "more candidates beside `configured` (the model's own settings): a list of tables with "
            "`name` and any of `optimizer`, `learning_rate`, `seed`. They share the configured "
            "network's architecture, so replicas serve any of them; `builder` in a candidate is "
            "refused at load. A checkpoint keeps the `configured` candidate; the others start "
            "afresh after a restart"
        ),
    )
    # why: faster switching gained only on Agrawal (docs/benchmarks/learning.md, "remeasured")
    window: int = Field(
        500,
        ge=10,
        le=1_000_000,
        description=(
            "samples each candidate's prequential loss is averaged over "
            "(`livefit_selection_score{model,candidate}`)"
        ),
    )
    margin: float = Field(
        0.05,
        ge=0,
        lt=1,
        allow_inf_nan=False,
        description=(
            "hysteresis: a challenger is served once its windowed loss is below `1 - margin` times "
            "the served candidate's (switches: `livefit_selection_switches_total`, a log line, and "
            "a `selection` event on `drift.events_topic`)"
        ),
    )
    min_samples_between_switches: int = Field(
        500,
        ge=0,
        description=(
            "samples trained after a switch (and at the start) before another switch is considered"
        ),
    )

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

    max_batch_size: int = Field(64, ge=1, le=65536, description="rows per model call at most")
    # why: 0, as Triton's; "auto" gained nothing here (BENCHMARKS.md#batch-timeout-0-fixed-auto)
    batch_timeout_ms: float | Literal["auto"] = Field(
        0.0,
        description=(
            "a batch fires this long after its oldest request arrived, or when full. `0`: as soon "
            "as the model is free, with every request that queued meanwhile (requests queue while "
            "the previous batch runs, so batches still grow with load), and a lone client never "
            "waits for company. Raise it for models "
            'whose cost hardly grows with the batch (GPU). `"auto"`: chosen for each batch from '
            "the arrival rate λ (rows/s) and the model call's cost `per_batch + per_row * "
            "rows`, fitted online (timed by the model thread's CPU time on a CPU, wall time on a "
            "GPU): a batch on an idle model waits for more rows only while the next row is worth "
            "waiting for, up to K = (λ·per_batch - 1) / (1 + λ·per_row) rows, i.e. (K - 1)/λ "
            "seconds; 0 when λ·(per_batch - per_row) ≤ 2 (a lone client, or a model whose call "
            "costs little next to the gap between requests); exported as "
            "`livefit_predict_batch_timeout_seconds`. Not the default yet: on the CPU benchmark "
            "model it gained nothing over `0`, and the models it is for (a call that costs much "
            "more than the gap between requests, e.g. on a GPU) were not benchmarked "
            "([batch timeout](../BENCHMARKS.md#batch-timeout-0-fixed-auto))"
        ),
    )
    max_batch_timeout_ms: float = Field(
        10.0,
        ge=0,
        le=10_000,
        description='the longest timeout `"auto"` chooses',
    )
    max_queue_rows: int = Field(
        4096,
        ge=1,
        description=(
            "rows queued per model before requests get 429 (a memory bound; the wait bound below "
            "usually acts first)"
        ),
    )
    max_queue_wait_ms: float | Literal["auto"] = Field(
        "auto",
        description=(
            "admission: a request is refused at once (429, before its body is read) when its "
            "expected wait before its batch starts is over this, or when it would be answered "
            "after its deadline. The wait is estimated from the event loop's lag, the running "
            "batch and the queued batches, timed by a batch cost (`per_row * rows + per_batch`) "
            'fitted online. `"auto"`: two full-batch model calls, at least 50 ms. A request that '
            "fits in the next batch is refused only for its deadline, so up to `max_batch_size` "
            "concurrent clients never get 429 from this bound; raise it for more concurrent "
            "clients that prefer waiting to retrying (a closed loop of 256 clients against a "
            "64-row batch queues about three batches)"
        ),
    )
    default_deadline_ms: float = Field(
        5000.0,
        gt=0,
        description="a request not served by then gets 504; requests may shorten it",
    )
    allowed_batch_sizes: list[int] | None = Field(
        None,
        description=(
            "padded batch sizes the inference function is compiled for; the last must equal "
            "`max_batch_size`"
        ),
        json_schema_extra={"unset": "powers of two up to `max_batch_size`"},
    )
    max_request_rows: int = Field(1024, ge=1, description="rows per request at most (413)")
    max_request_bytes: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        description="request body bytes at most (413)",
    )
    # why xla is opt-in: no gain over HTTP (BENCHMARKS.md#serving-runtimes-one-model-call)
    runtime: Literal["auto", "keras", "xla", "numpy"] = Field(
        "auto",
        description=(
            "what computes a batch: `keras` (the model traced by `tf.function`, every model), "
            "`xla` (the same compiled by XLA per padded batch size), `numpy` (a NumPy forward pass "
            "of a Dense chain: linear and mlp builders, the same float32 math); `auto` takes numpy "
            "where the model is a Dense chain on a CPU, else keras (xla's faster calls did not "
            "hold end to end over HTTP, and it compiles for seconds at start: opt-in). A runtime "
            "that cannot take the model, or whose outputs differ from Keras on a probe batch, "
            "falls back to keras with one log line. A 1-row call of the benchmark MLP: keras "
            "230-300 us, xla ~130 us, numpy ~11 us; of the LSTM: keras 470-620 us, xla ~156 us "
            "(BENCHMARKS.md, serving runtimes)"
        ),
    )

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

    publish_interval_s: float = Field(
        0.5,
        gt=0,
        le=3600,
        description=(
            "the weight topic gets at most one snapshot per interval (the newest; the last one "
            "always goes out on stop)"
        ),
    )
    serve_interval_s: float = Field(
        0.15,
        gt=0,
        le=3600,
        description=(
            "the trainer hands a snapshot (when the weights changed) to the learner's own serving "
            "this often: its in-process model, or a split learner's serving processes. Stretched "
            "to 20 times what copying the weights took, so a large model's copies take at most "
            "about 5 % of the trainer's time. 0.15 s: between fresher weights and the training "
            "each snapshot costs ([freshness](../BENCHMARKS.md#freshness-publish-to-served))"
        ),
    )
    topic: str | None = Field(
        None,
        description=("the weight stream" + PUBLISHED_TOPIC_RULES),
        json_schema_extra={"unset": "`livefit/<name>/weights`"},
    )
    signing_key_file: str | None = Field(
        None,
        description=(
            "(learner) the Ed25519 private key that signs every snapshot: PEM (PKCS#8, "
            "unencrypted), or the raw 32-byte seed (raw, base64 or hex). Unset: the learner "
            "creates one there on first start (mode 0600), writes the public key beside it "
            "(`weights-signing.pub`, PEM) and logs the public key (base64) and both paths. One key "
            "may sign every model. A key file must be a regular file of at most 64 KiB (a FIFO, a "
            "device such as `/dev/zero` or a larger file is refused before it is read: one line, "
            "exit 2)"
        ),
        json_schema_extra={"unset": "`<storage.dir>/keys/weights-signing.key`"},
    )
    verify_key: str | None = Field(
        None,
        description=(
            "(replicas, `WeightSubscriber`) the learner's public key: base64 of the raw 32 bytes, "
            "as the learner logs it, hex, or PEM text. Prefer "
            "`LIVEFIT_MODELS__<NAME>__WEIGHTS__VERIFY_KEY`"
        ),
    )
    verify_key_file: str | None = Field(
        None,
        description=(
            "(replicas) a file holding that public key; the default is what a learner sharing the "
            "storage dir wrote (a regular file of at most 64 KiB, as the signing key). A replica "
            "with neither key (nor `hmac_key`) refuses to start and says what to set, before it "
            "connects anywhere"
        ),
        json_schema_extra={"unset": "`<storage.dir>/keys/weights-signing.pub` if it exists"},
    )
    allow_unsigned: bool = Field(
        False,
        description=(
            "(replicas) with no key at all, accept weights nobody signed, with a loud WARNING at "
            "start: anyone who can publish on the broker then controls what the replica serves. "
            "For a trusted test network only"
        ),
    )
    hmac_key: SecretStr | None = Field(
        None,
        description=(
            "shared secret: the learner adds an HMAC-SHA256 beside its signature, receivers with "
            "the key require it. Weaker than the signature (any holder of the key, e.g. any "
            "replica, can forge); kept for existing setups. Prefer the environment variable"
        ),
    )
    max_inline_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description=(
            "larger snapshots are announced by a signed manifest and pulled over HTTP (so is a "
            "snapshot whose message is over the broker's maximum packet size, "
            "`broker.max_packet_size_bytes`)"
        ),
    )
    keep_versions: int = Field(
        4,
        ge=1,
        le=100,
        description="recent encoded snapshots kept for `GET /v1/models/<name>/weights`",
    )
    pull_url: str | None = Field(
        None,
        description=(
            "(replicas) the learner's base URL, the only place large snapshots are pulled from "
            "(and the bearer `pull_token` sent to); never a URL taken from a message. Unset, and "
            "no `http.public_url`: manifests are refused (`pull_failed`)"
        ),
        json_schema_extra={"unset": "`http.public_url`"},
    )
    pull_token: SecretStr | None = Field(
        None,
        description=(
            "(replicas) the bearer token sent with pulls from `pull_url`: that learner's "
            "`http.token`, for a replica following learners whose tokens differ "
            "([fleet](fleet.md)). Unset: this process's `http.token`. Prefer "
            "`LIVEFIT_MODELS__<NAME>__WEIGHTS__PULL_TOKEN`; never logged"
        ),
        json_schema_extra={"unset": "`http.token`"},
    )
    pull_timeout_s: float = Field(
        30.0,
        gt=0,
        description="replicas' HTTP pull timeout for large snapshots (for the whole body)",
    )
    max_pull_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description=(
            "(replicas) a pull larger than this (256 MiB, well above the model sizes livefit "
            "targets) is refused before any request; a body longer than its signed size is aborted "
            "as soon as it is exceeded (`too_large`)"
        ),
    )
    max_age_s: float = Field(
        86400.0,
        ge=0,
        description=(
            "(replicas, `WeightSubscriber`) refuse weights signed longer ago than this "
            "(`expired`), by the receiver's clock; `0`: no limit. Generous on purpose: clocks on "
            "different hosts differ, and a learner that has been down longer makes new replicas "
            "wait for it. See [Weights](mqtt.md#weights)"
        ),
    )
    refresh_interval_s: float = Field(
        3600.0,
        gt=0,
        description=(
            "(learner) re-sign and re-publish the newest snapshot this often when no new one went "
            "out, so an idle learner's retained weights never exceed `max_age_s`"
        ),
    )
    refused_unready_s: float = Field(
        60.0,
        ge=0,
        description=(
            "(replicas, a split learner's serving processes) readiness answers 503 once every "
            "weight message has been refused for this long since the last one that verified, and "
            "refusals keep coming (a learner signing with a rotated key, an architecture that no "
            "longer matches): the line names the outcome, e.g. `refused every snapshot for 60 s "
            "(last: bad_signature: ...)`; the last good weights keep serving, and one verified "
            "message (a new version, or the learner's re-signed snapshot) makes it ready again. "
            "`stale` messages (the served snapshot delivered again) count neither way; `0`: off. "
            "Anyone who may publish on the weight topic can start such a streak with forged "
            "messages while the learner is idle: the broker's ACL is the defence "
            "([Weights](mqtt.md#weights))"
        ),
    )

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
    # why: 0.3 lost least against the network alone (docs/benchmarks/defaults.md)
    rate: float = Field(
        0.3,
        gt=0,
        le=1000,
        allow_inf_nan=False,
        description=(
            "Hedge's rate: an expert's share is proportional to exp(-rate * its recent error), "
            "counted in wrong predictions (plus a tenth of the loss) for a classifier and in "
            "standardized absolute errors (the targets' units without target scaling) "
            "otherwise; of the order of Hedge's sqrt(8 ln 2 / 500) for two experts over the "
            "decay's window, so that close experts share and a clearly better one takes over"
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

    interval_s: float = Field(
        30.0,
        gt=0,
        description=(
            "checkpoint (weights, optimizer state, version, log position) this often, and at "
            "shutdown (unless the checkpoint of that exact version is on disk); written in the "
            "background. One that fails is tried again after 1, 2, 4, then every 5 s, also when "
            "the version has not moved, so storage that works again is noticed within seconds"
        ),
    )
    keep: int = Field(
        3,
        ge=1,
        le=1000,
        description=(
            "newest checkpoints kept; corrupt ones are set aside and the newest usable one is "
            "used, with the log replayed from its position: the log is kept behind the oldest kept "
            "checkpoint for that: it holds the stream of the last `keep - 1` checkpoint intervals "
            "and more (with `keep = 1` there is no fallback)"
        ),
    )


class VersionsSettings(Section):
    """Which past versions a model's serving keeps, for the versioned prediction paths
    (``/v1/models/<name>/versions/<N>:predict``, ``/v2/models/<name>/versions/<N>/infer``)."""

    keep_snapshots: int = Field(
        100,
        ge=1,
        le=100_000,
        description=(
            "the newest snapshots handed to serving that each serving process keeps (the newest "
            "always); with `weights.serve_interval_s = 0.15`, at least the last 15 s of a busy "
            "stream, longer when fewer steps come. A replica keeps the versions it received"
        ),
    )
    keep_bytes: int = Field(
        64 * 2**20,
        ge=0,
        description=(
            "at most this many bytes of kept snapshots' weights per model and serving process "
            "(64 MiB: 100 snapshots of a model up to 670 KB); the oldest go first, and the "
            "newest is kept whatever its size"
        ),
    )
    checkpoints: bool = Field(
        True,
        description=(
            "(the learner) also serve the versions of the checkpoints on disk (the newest "
            "`checkpoint.keep`, one every `checkpoint.interval_s`), read when first asked for. "
            "A checkpoint written before livefit kept its served weights (with "
            "`train.weight_average` or model selection, those may differ from the trained "
            "ones) is not served. Replicas have no checkpoints"
        ),
    )


class GuardSettings(Section):
    """The guard: serving holds the last good version while the newest scores worse
    (docs/operations.md, "The guard"). Training goes on; the hold moves through the serving
    record, so replicas follow, and never overrides an operator's pin."""

    enabled: bool = Field(
        False,
        description=(
            "guard this model's served version: with `reference_path` on the operator's trusted "
            'samples, else in shadow on the samples learned (docs/operations.md, "The guard"). '
            "Off by default: a hold makes serving lag the trainer, which an operator chooses"
        ),
    )
    reference_path: str | None = Field(
        None,
        description=(
            "a CSV file of labelled samples the operator vouches for and never publishes for "
            "training (one a row: the inputs flattened, then the target, as `livefit publish` "
            "reads): every served version is scored on it. Unset: the shadow comparison, the "
            "newest and the last good version on the same samples learned (catches a diverging "
            "step, not a label-flipping publisher). Read at start (a bad file refuses it) and "
            "again whenever the file changes (a bad new file is logged, the old set kept); a "
            "reference topic is not built"
        ),
    )
    margin: float = Field(
        0.1,
        ge=0,
        allow_inf_nan=False,
        description=(
            "hold when the newest's mean loss exceeds the best recent one's (shadow: the last "
            "good one's over `window` samples, and by a paired t statistic over 3) by more than "
            "this share of it (0.1: 10 % worse); release when it is within it again"
        ),
    )
    recent_versions: int = Field(
        20,
        ge=1,
        le=10_000,
        description="(reference set) the scored versions the best is chosen from, newest first",
    )
    window: int = Field(
        256,
        ge=1,
        le=1_000_000,
        description=(
            "(shadow) the samples, scored by the newest and the last good version alike, whose "
            "mean losses are compared"
        ),
    )
    held_long_s: float = Field(
        600.0,
        gt=0,
        allow_inf_nan=False,
        description=(
            "a hold older than this is reported as long (`held_long` in its events, a warning): "
            "a real drift makes a reference set stale, and the operator should refresh it"
        ),
    )


class LabelsSettings(Section):
    """Delayed labels (README "Delayed labels"): how long a prediction waits for its label."""

    ttl_s: float = Field(
        3600.0,
        gt=0,
        description=(
            "how long a prediction recorded with an id waits for its label, and a label for its "
            "prediction record (see [delayed labels](labels.md))"
        ),
    )
    max_pending: int = Field(
        100_000,
        ge=1,
        le=10_000_000,
        description=(
            "predictions waiting at most (likewise early labels); beyond it the oldest expires"
        ),
    )
    on_expiry: Literal["drop", "default"] = Field(
        "drop",
        description=(
            "what an expired prediction becomes: `drop` (counted) or `default` (learned with "
            "`default_y`, Azure Personalizer's default reward)"
        ),
    )
    default_y: float | list[Any] | None = Field(
        None,
        description=(
            'the label learned on expiry with `on_expiry = "default"`: a number or list of the '
            "target shape (checked when the file loads)"
        ),
    )
    tick_s: float = Field(
        1.0,
        gt=0,
        le=3600,
        description=(
            "how often the learner checks for expired predictions; an expiry happens up to this "
            "much after its TTL"
        ),
    )
    record_buffer_rows: int = Field(
        10_000,
        ge=1,
        description=(
            "(serving processes) prediction records waiting for the broker at most; beyond it rows "
            "are dropped and counted, the prediction itself never waits"
        ),
    )
    batch_window_ms: float = Field(
        50.0,
        ge=0,
        le=60_000,
        allow_inf_nan=False,
        description=(
            "how long the trainer waits for more joined labels when every sample it took was "
            "made by the label join and the batch is not full: labels that fall due one by one "
            "are learned as one minibatch, as samples in a message are (0: each as it comes; "
            "train.max_wait_ms where that is longer). Not at version 0: an untrained model "
            "learns its first labels at once, as whatever it learns beats serving it"
        ),
    )
    topic: str | None = Field(
        None,
        description=("where labels arrive (replicas publish them there)" + PUBLISHED_TOPIC_RULES),
        json_schema_extra={"unset": "`livefit/<name>/labels`"},
    )
    predictions_topic: str | None = Field(
        None,
        description=("where serving processes send prediction records" + PUBLISHED_TOPIC_RULES),
        json_schema_extra={"unset": "`livefit/<name>/predictions`"},
    )

    @field_validator("topic", "predictions_topic")
    @classmethod
    def _check_topics(cls, value: str | None) -> str | None:
        return checked_topic(value)  # replicas publish on them; the learner reads them

    @model_validator(mode="after")
    def _check_default(self) -> LabelsSettings:
        if self.on_expiry == "default" and self.default_y is None:
            raise ValueError('on_expiry = "default" needs default_y, the label to learn')
        return self
