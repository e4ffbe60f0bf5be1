"""Predict with a livefit model using NumPy alone: no TensorFlow, no livefit.

    python examples/numpy_reader.py http://127.0.0.1:8000 demo '[[0.1, 0.2, 0.3, 0.4, 0.5]]'

Fetches the newest kept version's description (``GET /v1/models/{name}/description``) and
that same version's weights as safetensors (``GET /v1/models/{name}/weights?version=N``),
reads the safetensors file by hand (8-byte header length, JSON header, raw little-endian
data) and runs the description's ``layers``. Prints one JSON line: the version and the
outputs. ``LIVEFIT_TOKEN`` in the environment is sent as the bearer token. The functions
``read_safetensors`` and ``forward`` are what another runtime would port.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from typing import Any

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64,
          "I32": np.int32}  # fmt: skip


def read_safetensors(data: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors (by key) and the metadata of a safetensors file."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    metadata = header.pop("__metadata__", {})
    body = memoryview(data)[8 + size :]
    tensors = {}
    for key, info in header.items():
        start, end = info["data_offsets"]
        dtype = np.dtype(DTYPES[info["dtype"]]).newbyteorder("<")
        array = np.frombuffer(body[start:end], dtype=dtype)
        tensors[key] = array.reshape(info["shape"])
    return tensors, metadata


def _activation(name: str, x: np.ndarray) -> np.ndarray:
    if name == "linear":
        return x
    if name == "relu":
        return np.maximum(x, np.float32(0))
    if name == "tanh":
        return np.tanh(x)
    if name == "sigmoid":
        return np.float32(1) / (np.float32(1) + np.exp(-x))
    if name == "softmax":
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    raise ValueError(f"activation {name!r} is not implemented here")


def _lstm(step: dict[str, Any], t: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Keras' LSTM: gates i, f, c, o side by side in the kernels' columns."""
    units = step["units"]
    kernel, recurrent = t[step["kernel"]], t[step["recurrent_kernel"]]
    bias = t[step["bias"]] if step["bias"] else np.zeros(4 * units, np.float32)
    h = np.zeros((x.shape[0], units), np.float32)
    c = np.zeros_like(h)
    outputs = []
    for time_step in range(x.shape[1]):
        z = x[:, time_step] @ kernel + h @ recurrent + bias
        i, f, g, o = (z[:, k * units : (k + 1) * units] for k in range(4))
        i = _activation(step["recurrent_activation"], i)
        f = _activation(step["recurrent_activation"], f)
        o = _activation(step["recurrent_activation"], o)
        c = f * c + i * _activation(step["activation"], g)
        h = o * _activation(step["activation"], c)
        outputs.append(h)
    return np.stack(outputs, axis=1) if step["return_sequences"] else h


def forward(
    description: dict[str, Any], tensors: dict[str, np.ndarray], x: np.ndarray
) -> np.ndarray:
    """The network's outputs for the rows ``x``, following ``description["layers"]``."""
    if description.get("layers") is None:
        raise ValueError(f"no layer list: {description.get('layers_note')}")
    return _run(description["layers"], tensors, np.asarray(x, dtype=np.float32))


def _run(steps: list[dict[str, Any]], tensors: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    for step in steps:
        kind = step["kind"]
        if kind == "standardize":
            x = (x - tensors[step["mean"]]) / tensors[step["std"]]
        elif kind == "unstandardize":
            x = x * tensors[step["std"]] + tensors[step["mean"]]
        elif kind == "dense":
            x = x @ tensors[step["kernel"]]
            if step["bias"]:
                x = x + tensors[step["bias"]]
            x = _activation(step["activation"], x)
        elif kind == "activation":
            x = _activation(step["activation"], x)
        elif kind == "reshape":
            x = x.reshape((x.shape[0], *step["output_shape"]))
        elif kind == "lstm":
            x = _lstm(step, tensors, x)
        elif kind == "mixture":  # each expert on the same input, weighed by its share
            share = tensors[step["share"]]
            outputs = [_run(branch, tensors, x) for branch in step["experts"]]
            x = sum(weight * out for weight, out in zip(share, outputs, strict=True))
        elif kind != "dropout":  # dropout: the identity when predicting
            raise ValueError(f"layer kind {kind!r} is not implemented here")
    return x


def _get(url: str) -> bytes:
    token = os.environ.get("LIVEFIT_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read()


def main() -> None:
    base, name, rows = sys.argv[1].rstrip("/"), sys.argv[2], json.loads(sys.argv[3])
    description = json.loads(_get(f"{base}/v1/models/{name}/description"))
    version = description["version"]
    tensors, metadata = read_safetensors(_get(f"{base}/v1/models/{name}/weights?version={version}"))
    assert json.loads(metadata["description"]) == description["description"]
    outputs = forward(description["description"], tensors, np.asarray(rows, dtype=np.float32))
    print(json.dumps({"version": version, "outputs": outputs.tolist()}))


if __name__ == "__main__":
    main()
