"""``python -m tests.connection_server PORT HTTP_JSON [SERVE_JSON]``: the stand-in runtime behind the real
``run_server`` (the socket bound first, uvicorn with livefit's connection settings), in its
own process, so that a test can count the server's file descriptors and stop it with SIGTERM.

``HTTP_JSON`` is the ``[http]`` section as JSON (``port`` is set from ``PORT``);
``SERVE_JSON`` changes the model's ``serve`` settings. The model serves weights from the start.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> int:
    from livefit.server.runtime.http_server import run_server
    from tests.stub_runtime import StubRuntime

    http = {**json.loads(sys.argv[2]), "port": int(sys.argv[1])}
    runtime = StubRuntime(http=http)
    if len(sys.argv) > 3:
        endpoint = runtime.endpoints()["m"]
        serve = endpoint.settings.serve.model_copy(update=json.loads(sys.argv[3]))
        endpoint.settings = endpoint.settings.model_copy(update={"serve": serve})
    runtime.publish(1)
    return run_server(runtime.settings, runtime)


if __name__ == "__main__":
    sys.exit(main())
