"""The FastAPI server a Keras user writes by hand, and the HTTP ceiling of the same stack.

``--mode predict_on_batch``: each request's rows go straight to ``model.predict_on_batch``.
``--mode predict``: the same with ``model.predict(x, verbose=0)``, the call most tutorials show.
``--mode constant``: no model; the endpoint reads the body and returns a fixed response of the
size livefit answers with: what the HTTP stack alone costs (uvicorn with uvloop and httptools,
one worker, FastAPI, as livefit runs).

``--endpoint async`` (default) calls the model on the event loop, one request at a time;
``--endpoint sync`` makes it a plain ``def`` endpoint that FastAPI runs in its thread pool.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

from bench.models import ModelSpec


def build_app(spec: ModelSpec, mode: str, endpoint: str, constant: bytes) -> FastAPI:
    """The app for ``mode``; the model (if any) is built before the app is returned."""
    app = FastAPI()
    path = spec.predict_path()

    @app.get("/health")
    async def health() -> dict[str, bool]:
        return {"ok": True}

    if mode == "constant":

        @app.post(path)
        async def constant_answer(request: Request) -> Response:
            await request.body()
            return Response(constant, media_type="application/json")

        return app

    model = spec.build()
    call = model.predict_on_batch if mode == "predict_on_batch" else _predict(model)
    call(np.zeros((1, *spec.input_shape), dtype=np.float32))  # build and trace before serving

    def answer(body: dict) -> dict:
        x = np.asarray(body["instances"], dtype=np.float32)
        return {"predictions": np.asarray(call(x)).tolist(), "model_version": "0"}

    if endpoint == "sync":

        @app.post(path)
        def predict_sync(body: dict) -> dict:
            return answer(body)

    else:

        @app.post(path)
        async def predict_async(request: Request) -> dict:
            return answer(await request.json())

    return app


def _predict(model):
    return lambda x: model.predict(x, verbose=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.fastapi_keras")
    parser.add_argument(
        "--mode", choices=["predict_on_batch", "predict", "constant"], required=True
    )
    parser.add_argument("--endpoint", choices=["async", "sync"], default="async")
    parser.add_argument("--model-spec", required=True, help="JSON of bench.models.ModelSpec")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--constant-file", help="the response body of --mode constant")
    parser.add_argument(
        "--workers", type=int, default=1,
        help="processes sharing one listening socket (forked after the app is built; "
        "--mode constant only, which holds no TensorFlow state)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    spec = ModelSpec.from_json(json.loads(args.model_spec))
    constant = b""
    if args.mode == "constant":
        with open(args.constant_file, "rb") as handle:
            constant = handle.read()
    app = build_app(spec, args.mode, args.endpoint, constant)
    if args.workers == 1:
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
        return 0
    if args.mode != "constant":
        parser.error("--workers above 1 needs --mode constant")
    _prefork(app, args.port, args.workers)
    return 0


def _prefork(app: FastAPI, port: int, workers: int) -> None:
    """``workers`` processes serving ``app`` on one socket, as ``livefit replica --workers``
    shares its port; the forked ones die with this one."""
    from livefit.server.runtime.children import die_with_parent

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(2048)
    preexec = die_with_parent()
    for _ in range(workers - 1):
        if os.fork() == 0:
            if preexec is not None:
                preexec()
            break
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
