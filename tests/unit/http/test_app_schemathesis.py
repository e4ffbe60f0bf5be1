"""Schema-driven fuzzing: schemathesis generates requests from the app's own OpenAPI schema and
sends them to a real uvicorn. Whatever it sends, the server never answers with a 5xx.

Some generated requests are made hostile before they go: a number in the body becomes a
401-digit integer, 1e308, a boolean or a string of non-ASCII digits; the OIP timeout overflows;
Inference-Header-Content-Length or X-Deadline-Ms lies (too long, too short, negative,
superscript or 5,000 digits)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from livefit.server.http.app import create_app
from tests.inprocess import InProcessServer
from tests.stub_runtime import StubRuntime

schemathesis = pytest.importorskip("schemathesis")
# schemathesis and its dependencies warn about their own internals; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::ResourceWarning")


HOSTILE_NUMBERS = st.sampled_from(
    [10**400, -(10**400), 2**64, 2**63, 1e308, -1e308, True, False, "\u0661\u0662", "\u00b2",
     "\uff11\uff10", "1e999", "nan", None, [], {}]
)  # fmt: skip
HOSTILE_HEADERS = st.one_of(
    st.sampled_from(["\u00b2", "\u00b9", "9" * 5000, "-1", "0", "+8", "8 x", "1e3", "0x10", "",
                     "nan", "inf", "1e999", "-0.0"]),
    st.integers(min_value=-(10**6), max_value=10**6).map(str),
)  # fmt: skip


def _numbers_in(tree: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to the numbers in a JSON tree."""
    if isinstance(tree, dict):
        return [p for k, v in tree.items() for p in _numbers_in(v, (*path, k))]
    if isinstance(tree, list):
        return [p for i, v in enumerate(tree) for p in _numbers_in(v, (*path, i))]
    return [path] if isinstance(tree, int | float) and not isinstance(tree, bool) else []


def make_hostile(case: Any, data: st.DataObject) -> None:
    """Turn a generated request hostile in one way (or leave it as generated)."""
    kind = data.draw(st.sampled_from(["none", "number", "timeout", "deadline", "binary"]))
    headers = dict(case.headers or {})
    if kind == "number" and (paths := _numbers_in(case.body)):
        *parents, last = data.draw(st.sampled_from(paths))
        node = case.body
        for key in parents:
            node = node[key]
        node[last] = data.draw(HOSTILE_NUMBERS)
    elif kind == "timeout" and isinstance(case.body, dict):
        case.body["parameters"] = {"timeout": data.draw(HOSTILE_NUMBERS)}
    elif kind == "deadline":
        headers["X-Deadline-Ms"] = data.draw(HOSTILE_HEADERS)
    elif kind == "binary":
        headers["Inference-Header-Content-Length"] = data.draw(HOSTILE_HEADERS)
    case.headers = headers


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
        @given(case=operation.as_strategy(), real_model=st.booleans(), data=st.data())
        def call(case, real_model: bool, data: st.DataObject) -> None:  # type: ignore[no-untyped-def]
            if real_model and case.path_parameters and "name" in case.path_parameters:
                case.path_parameters["name"] = "m"  # reach the model, not only the 404 path
            if case.method == "POST":
                make_hostile(case, data)
            response = case.call(base_url=served.url, timeout=10)
            codes.add(response.status_code)
            if response.status_code >= 500:
                failures.append(
                    (case.method, case.formatted_path, response.status_code, response.text[:200])
                )

        call()
    assert not failures, failures[:5]
    assert {200, 400, 404} <= codes, codes  # the fuzzing reached the model, not only errors
