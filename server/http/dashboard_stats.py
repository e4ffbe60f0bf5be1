"""The dashboard's data: ``collect_stats`` turns one read of metric families (a registry's
``collect()``, or a worker group's merged exposition) into per-model numbers, each a float or
``None`` (absent series, NaN, infinity), never an error; latency and freshness quantiles are
estimated from histogram buckets as Prometheus's ``histogram_quantile`` does. Pure functions.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from prometheus_client.samples import Sample

# JSON key -> the one sample (by name) of a per-model gauge or counter.
SINGLE_VALUES = {
    "train_samples_total": "livefit_train_samples_total",
    "train_steps_total": "livefit_train_steps_total",
    "queue_depth": "livefit_queue_depth",
    "train_loss": "livefit_train_loss",
    "prequential_loss": "livefit_prequential_loss",
    "prequential_accuracy": "livefit_prequential_accuracy",
    "model_version": "livefit_model_version",
    "serving_version": "livefit_serving_version",
    "weights_age_seconds": "livefit_weights_age_seconds",
}

# What a split learner's training process reports and its serving processes do not.
TRAINING_OWNED = {
    "livefit_train_samples_total", "livefit_train_steps_total", "livefit_queue_depth",
    "livefit_train_loss", "livefit_prequential_loss", "livefit_prequential_accuracy",
    "livefit_model_version",
}  # fmt: skip
ModelSamples = dict[str, list[Sample]]  # sample name -> that model's samples of it


def collect_stats(families: Iterable[Any], models: list[str], role: str) -> dict[str, Any]:
    """``{"role", "time" (epoch s), "models": {name: model_stats}}`` from one read of the
    metric ``families`` (a registry's ``collect()``, or a group's merged exposition)."""
    index = index_samples(families, set(models))
    return {
        "role": role,
        "time": time.time(),
        "models": {name: model_stats(index[name]) for name in models},
    }


def index_samples(families: Iterable[Any], models: set[str]) -> dict[str, ModelSamples]:
    """The samples labelled with one of ``models``, grouped by model, then by sample name."""
    index: dict[str, ModelSamples] = {name: defaultdict(list) for name in models}
    for family in families:
        for sample in family.samples:
            per_model = index.get(sample.labels.get("model", ""))
            if per_model is not None:
                per_model[sample.name].append(sample)
    return index


def model_stats(samples: ModelSamples) -> dict[str, Any]:
    """Everything the dashboard shows for one model; ``None`` wherever a series is absent."""
    stats: dict[str, Any] = {key: single(samples, name) for key, name in SINGLE_VALUES.items()}
    requests = samples.get("livefit_predict_requests_total", [])
    stats["predict_requests_total"] = total(requests)
    for key, kind in (("predict_client_errors_total", "client"),
                      ("predict_refused_total", "refused"),
                      ("predict_server_errors_total", "server")):  # fmt: skip
        answered = [s for s in requests if answer_kind(s.labels.get("code", "")) == kind]
        stats[key] = finite(math.fsum(s.value for s in answered)) if requests else None
    latency = buckets(samples, "livefit_predict_latency_seconds")
    stats["predict_latency"] = {
        "p50": bucket_quantile(0.5, latency),
        "p99": bucket_quantile(0.99, latency),
    }
    stats["predict_batch_mean"] = histogram_mean(samples, "livefit_predict_batch_size")
    stats["freshness_p50"] = bucket_quantile(0.5, freshness_buckets(samples))
    for sample in samples.get("livefit_expert_weight", []):  # experts: each one's share
        if sample.labels.get("worker") in (None, "training"):
            stats[f"expert_weight_{sample.labels.get('expert', '')}"] = finite(sample.value)
    return stats


def answer_kind(code: str) -> str:
    """What a prediction's HTTP status says: ``ok``; ``client`` (4xx but 429: the request
    itself was wrong, its client's error); ``refused`` (429, 503, 504: not served now, under
    load or without weights yet; retry); ``server`` (500 and other 5xx: livefit's error)."""
    if code.startswith("2"):
        return "ok"
    if code in ("429", "503", "504"):
        return "refused"
    return "client" if code.startswith("4") else "server"


def finite(value: float | None) -> float | None:
    """``value``, or ``None`` for NaN and infinities (which JSON cannot carry)."""
    return value if value is not None and math.isfinite(value) else None


def single(samples: ModelSamples, name: str) -> float | None:
    """The value of the model's one sample called ``name``, or ``None``. In a split learner's
    merged metrics, the training process's sample for what it owns (TRAINING_OWNED)."""
    found = samples.get(name)
    if not found:
        return None
    if name in TRAINING_OWNED:
        found = [s for s in found if s.labels.get("worker") == "training"] or found
    return finite(found[0].value)


def total(found: list[Sample]) -> float | None:
    """The sum of ``found`` (e.g. a counter over all its codes), or ``None`` if it is empty."""
    return finite(math.fsum(s.value for s in found)) if found else None


def buckets(samples: ModelSamples, histogram: str) -> list[tuple[float, float]]:
    """The histogram's cumulative buckets as sorted ``(upper bound, count)``, +Inf last
    (summed over the processes of a group)."""
    summed: dict[float, float] = defaultdict(float)
    for s in samples.get(f"{histogram}_bucket", []):
        summed[float(s.labels["le"])] += s.value
    return sorted(summed.items())


def freshness_buckets(samples: ModelSamples) -> list[tuple[float, float]]:
    """``livefit_freshness_seconds`` of one stage: "served" where this server serves fresh
    weights it did not train (a replica, a split learner's serving processes: what a prediction
    gets), else "published" (a one-process learner). Mixing the two would make neither."""
    found = samples.get("livefit_freshness_seconds_bucket", [])
    served = [s for s in found if s.labels.get("stage") == "served"]
    return buckets(
        {"livefit_freshness_seconds_bucket": served or found}, "livefit_freshness_seconds"
    )


def histogram_mean(samples: ModelSamples, histogram: str) -> float | None:
    """Sum over count of all observations, or ``None`` before the first one."""
    count = total(samples.get(f"{histogram}_count", []))
    summed = total(samples.get(f"{histogram}_sum", []))
    return finite(summed / count) if count and summed is not None else None


def bucket_quantile(q: float, cumulative: list[tuple[float, float]]) -> float | None:
    """The ``q``-quantile (0 < q < 1) estimated as Prometheus's ``histogram_quantile`` does.

    Linear interpolation inside the bucket holding the rank, the first bucket starting at 0;
    a rank in the +Inf bucket gives the highest finite bound. ``None`` with no observations.
    """
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    rank = q * cumulative[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in cumulative:
        if count >= rank:
            if math.isinf(upper):
                return lower
            return finite(lower + (upper - lower) * (rank - below) / (count - below))
        lower, below = upper, count
    return None
