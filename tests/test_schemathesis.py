"""Schema-driven fuzzing: schemathesis generates requests from the app's own OpenAPI schema and
sends them to a real uvicorn. Whatever it sends, the server never answers with a 5xx."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from livefit.server.app import create_app
from tests.inprocess import InProcessServer
from tests.stub_runtime import StubRuntime

schemathesis = pytest.importorskip("schemathesis")
# schemathesis and its dependencies warn about their own internals; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::ResourceWarning")


@pytest.fixture(scope="module")
def served() -> Iterator[InProcessServer]:
    runtime = StubRuntime()
    server = InProcessServer(create_app(runtime)).start()
    runtime.publish(1)
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    yield


def test_no_server_errors(served: InProcessServer) -> None:
    """Every operation in the schema, 40 generated requests each (schemathesis' strategies
    driven by hypothesis directly: its pytest plugin does not run under pytest 9)."""
    schema = schemathesis.openapi.from_url(f"{served.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {
        "/v1/models/{name}:predict",
        "/v2/models/{name}/infer",
    }
    failures: list[tuple[str, str, int, str]] = []
    codes: set[int] = set()
    for operation in operations:

        @settings(
            max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        @given(case=operation.as_strategy(), real_model=st.booleans())
        def call(case, real_model: bool) -> None:  # type: ignore[no-untyped-def]
            if real_model and case.path_parameters and "name" in case.path_parameters:
                case.path_parameters["name"] = "m"  # reach the model, not only the 404 path
            response = case.call(base_url=served.url, timeout=10)
            codes.add(response.status_code)
            if response.status_code >= 500:
                failures.append(
                    (case.method, case.formatted_path, response.status_code, response.text[:200])
                )

        call()
    assert not failures, failures[:5]
    assert {200, 400, 404} <= codes, codes  # the fuzzing reached the model, not only errors
