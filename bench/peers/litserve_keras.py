"""LitServe serving the same Keras model, set up as LitServe's documentation recommends.

A ``LitAPI`` whose ``setup`` builds the model (in LitServe's inference worker process),
``decode_request`` takes the row of a TF Serving style body, LitServe's default ``batch``
stacks the rows, ``predict`` runs ``model.predict_on_batch`` on the batch and the default
``unbatch`` splits it again. Batching: the same ``max_batch_size`` and timeout as livefit.
Settings: ``accelerator="cpu"``, one inference worker, one API server process,
``fast_queue=True`` (ZeroMQ, which LitServe recommends above 100 requests/s).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import litserve as ls
import numpy as np

from bench.models import ModelSpec


class KerasAPI(ls.LitAPI):
    """One Keras model behind LitServe's batching loop."""

    def __init__(self, spec: dict[str, Any], max_batch_size: int, batch_timeout_s: float) -> None:
        model_spec = ModelSpec.from_json(spec)
        super().__init__(
            max_batch_size=max_batch_size,
            batch_timeout=batch_timeout_s,
            api_path=model_spec.predict_path(),
        )
        self.model_spec = spec

    def setup(self, device: str) -> None:
        spec = ModelSpec.from_json(self.model_spec)
        self.model = spec.build()
        for size in (1, self.max_batch_size):  # trace before the first request
            self.model.predict_on_batch(np.zeros((size, *spec.input_shape), dtype=np.float32))

    # No annotations on the two hooks below: LitServe builds its endpoint from them (an
    # annotated request becomes a pydantic body, or with postponed annotations a query field).
    def decode_request(self, request, **kwargs):
        return np.asarray(request["instances"][0], dtype=np.float32)

    def predict(self, x: np.ndarray, **kwargs: Any) -> np.ndarray:
        return np.asarray(self.model.predict_on_batch(x))

    def encode_response(self, output, **kwargs):
        return {"predictions": [np.asarray(output).tolist()], "model_version": "0"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.litserve_keras")
    parser.add_argument("--model-spec", required=True, help="JSON of bench.models.ModelSpec")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--batch-timeout-ms", type=float, default=2.0)
    args = parser.parse_args(argv)
    api = KerasAPI(json.loads(args.model_spec), args.max_batch_size, args.batch_timeout_ms / 1e3)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, fast_queue=True)
    server.run(
        host="127.0.0.1",
        port=args.port,
        num_api_servers=1,
        log_level="warning",
        generate_client_file=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
