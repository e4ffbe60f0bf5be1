"""The prediction API's requests and answers, as pure functions (no I/O): the ``HttpCall`` to
send for a prediction, labels or a model's version, and the ``PredictResult``, count or version
read back from the answer, or a ``PredictError`` saying what the server sent instead.
``predict`` sends them; ``predict_retry`` decides what a failed attempt means.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

import httpx
import numpy as np
from numpy.typing import ArrayLike

Protocol = Literal["tfserving", "v2"]
PROTOCOLS: tuple[Protocol, ...] = ("tfserving", "v2")
VERSION_HEADER = "X-Model-Version"
_JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True, slots=True)
class PredictResult:
    """One prediction: float32 ``outputs`` of shape (N, *output_shape), one row per input row,
    and the ``version`` of the weights that computed them. NaN stands for the server's null."""

    outputs: np.ndarray
    version: int
    ids: list[str | int] | None = None  # the row ids the server echoed, when sent


class PredictError(Exception):
    """A prediction or status call that failed for good.

    ``status`` is the HTTP status of the last answer, or 0 when no answer came (the server could
    not be reached, or did not answer in ``timeout``). ``message`` is the server's own message
    where it sent one. ``retry_after`` is the last Retry-After in seconds, if any; ``attempts``
    counts the requests sent.
    """

    def __init__(
        self, status: int, message: str, retry_after: float | None = None, attempts: int = 1
    ) -> None:
        self.status = status
        self.message = message
        self.retry_after = retry_after
        self.attempts = attempts
        prefix = f"HTTP {status}" if status else "no answer"
        suffix = f" (gave up after {attempts} attempts)" if attempts > 1 else ""
        super().__init__(f"{prefix}: {message}{suffix}")


@dataclass(frozen=True, slots=True)
class HttpCall:
    """One request to send: ``method`` and ``path`` (relative to the base URL), an optional JSON
    ``body``, and for predictions the number of ``rows`` the answer must have."""

    method: str
    path: str
    body: bytes | None = None
    rows: int = 0

    @property
    def headers(self) -> Mapping[str, str] | None:
        return _JSON_HEADERS if self.body is not None else None


def predict_call(
    protocol: Protocol, model: str, rows: ArrayLike, ids: list[str | int] | None = None
) -> HttpCall:
    """The request predicting ``rows`` (N, *input_shape) with ``model``; ``ids``, one per row,
    makes the server record the predictions for delayed labels.

    Raises ValueError for rows that are not a non-empty array of finite float32 numbers, which the
    server would refuse anyway.
    """
    array = _rows(rows)
    name = quote(model, safe="")
    if protocol == "tfserving":
        path, document = f"/v1/models/{name}:predict", {"instances": array.tolist()}
        if ids is not None:
            document["ids"] = list(ids)
    else:
        tensor = {
            "name": "input",
            "shape": list(array.shape),
            "datatype": "FP32",
            "data": array.reshape(-1).tolist(),
        }
        path, document = f"/v2/models/{name}/infer", {"inputs": [tensor]}
        if ids is not None:
            document["parameters"] = {"ids": list(ids)}
    body = json.dumps(document, separators=(",", ":")).encode()
    return HttpCall("POST", path, body, rows=len(array))


def parse_prediction(protocol: Protocol, call: HttpCall, response: httpx.Response) -> PredictResult:
    """The outputs and weights version in a successful predict answer.

    Raises PredictError when the answer does not have that shape or not one row per row sent.
    """
    body = _json_object(response)
    try:
        outputs = _tf_outputs(body) if protocol == "tfserving" else _v2_outputs(body)
        version = int(body.get("model_version", response.headers.get(VERSION_HEADER)))
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise _malformed(response, f"a {protocol} prediction", exc) from None
    if outputs.ndim == 0 or outputs.shape[0] != call.rows:
        got = "a scalar" if outputs.ndim == 0 else f"{outputs.shape[0]} rows"
        raise PredictError(response.status_code, f"the server sent {got} for {call.rows} rows")
    echoed = body.get("ids") if protocol == "tfserving" else body.get("parameters", {}).get("ids")
    return PredictResult(outputs, version, echoed)


def labels_call(
    model: str, ids: list[str | int], y: ArrayLike, w: ArrayLike | None = None
) -> HttpCall:
    """The request sending labels ``y`` (N, *target_shape) for the rows predicted as ``ids``."""
    document: dict[str, Any] = {"id": list(ids), "y": np.asarray(y, dtype=np.float64).tolist()}
    if w is not None:
        document["w"] = np.asarray(w, dtype=np.float64).tolist()
    body = json.dumps(document, separators=(",", ":")).encode()
    return HttpCall("POST", f"/v1/models/{quote(model, safe='')}/labels", body)


def parse_labels(response: httpx.Response) -> int:
    """How many labels the server forwarded to the learner."""
    try:
        return int(_json_object(response)["accepted"])
    except (KeyError, TypeError, ValueError) as exc:
        raise _malformed(response, "a labels answer", exc) from None


def model_version_call(protocol: Protocol, model: str) -> HttpCall:
    """The status (tfserving) or metadata (v2) request for ``model``."""
    prefix = "/v1/models/" if protocol == "tfserving" else "/v2/models/"
    return HttpCall("GET", prefix + quote(model, safe=""))


def parse_model_version(protocol: Protocol, response: httpx.Response) -> int | None:
    """The newest version the model serves, or None while it has no weights yet."""
    body = _json_object(response)
    try:
        if protocol == "tfserving":
            entries = body["model_version_status"]
            versions = [int(e["version"]) for e in entries if e.get("state") == "AVAILABLE"]
        else:
            versions = [int(v) for v in body["versions"]]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _malformed(response, f"{protocol} model metadata", exc) from None
    return max(versions, default=None)


def error_message(response: httpx.Response) -> str:
    """The server's ``{"error": ...}`` message, or the start of whatever else it sent."""
    try:
        document = response.json()
    except ValueError:
        document = None
    if isinstance(document, dict) and isinstance(document.get("error"), str):
        return document["error"]
    return response.text[:200] or response.reason_phrase


def _rows(rows: ArrayLike) -> np.ndarray:
    with np.errstate(over="ignore"):  # too large for float32 becomes inf, refused below
        array = np.asarray(rows, dtype=np.float32)
    if array.ndim == 0 or len(array) == 0:
        raise ValueError(f"rows must have shape (N, *input_shape) with N >= 1, got {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError("rows hold NaN, infinity or numbers too large for float32")
    return array


def _tf_outputs(body: dict[str, Any]) -> np.ndarray:
    return np.asarray(body["predictions"], dtype=np.float32)


def _v2_outputs(body: dict[str, Any]) -> np.ndarray:
    tensor = body["outputs"][0]  # livefit models have exactly one output
    return np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])


def _json_object(response: httpx.Response) -> dict[str, Any]:
    try:
        document = response.json()
    except ValueError as exc:
        raise _malformed(response, "JSON", exc) from None
    if not isinstance(document, dict):
        raise _malformed(response, "a JSON object", TypeError(type(document).__name__))
    return document


def _malformed(response: httpx.Response, expected: str, exc: Exception) -> PredictError:
    return PredictError(
        response.status_code,
        f"the server's answer is not {expected} ({type(exc).__name__}: {exc})",
    )
