"""The app's ``Runtime`` protocol: every runtime implements every member (the app reads none of
them with ``getattr``), and readiness answers with the runtime's own problems."""

from __future__ import annotations

import httpx
import pytest

from livefit.server.http.app import Runtime, create_app
from livefit.server.runtime.learner import LearnerRuntime
from livefit.server.runtime.learner_serving import LearnerServingRuntime
from livefit.server.runtime.replica import ReplicaRuntime
from tests.inprocess import InProcessServer
from tests.stub_runtime import StubRuntime

MEMBERS = {name for name in vars(Runtime) if not name.startswith("_")} | set(
    Runtime.__annotations__
)
SET_IN_INIT = {"metrics", "settings"}  # instance attributes: every runtime's __init__ sets them


@pytest.mark.parametrize("runtime", [LearnerRuntime, ReplicaRuntime, LearnerServingRuntime,
                                     StubRuntime])  # fmt: skip
def test_every_runtime_implements_every_member(runtime: type) -> None:
    assert {"role", "wait_newer_weights_s", "preflight", "problems", "endpoints"} <= MEMBERS
    missing = sorted(m for m in MEMBERS - SET_IN_INIT if not hasattr(runtime, m))
    assert missing == []
    assert runtime.role in ("learner", "replica")
    assert runtime.wait_newer_weights_s >= 0


def test_readiness_answers_with_the_runtime_problems() -> None:
    runtime = StubRuntime()
    server = InProcessServer(create_app(runtime)).start()
    try:
        answer = httpx.get(f"{server.url}/v2/health/ready", timeout=10)
        assert answer.status_code == 503
        assert answer.json() == {"ready": False, "problems": ["model m: no weights yet"]}
        runtime.publish(1)
        answer = httpx.get(f"{server.url}/v2/health/ready", timeout=10)
        assert (answer.status_code, answer.json()) == (200, {"ready": True})
    finally:
        server.stop()
