"""The admin routes through a real uvicorn (``http.admin_api``): off (403) without an admin
token, 401 without or with a wrong one, the prediction token is not the admin token; a
label moved there is served on the TF Serving label path and named in the answer; a pin
moves the unversioned path; a body with an unknown field is 400; a replica's moves are 409."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from livefit.server.http.app import create_app
from livefit.server.serve.version_book import VersionBook
from livefit.server.storage.serving_record_file import ServingRecordFile
from livefit.server.weights.format import WeightsMeta, encode_weights
from livefit.server.wire.serving_record import ServingRecord
from livefit.server.wire.snapshot import Snapshot
from tests.inprocess import InProcessServer
from tests.unit.http.test_predict_api_versions import VersionedRuntime

ADMIN = {"Authorization": "Bearer admin-secret"}
ROWS = {"instances": [[1.0, 2.0]]}


class AdminRuntime(VersionedRuntime):
    """The versioned stub with a learner's book of its serving record."""

    def __init__(self, directory: Path, http: dict[str, Any]) -> None:
        super().__init__()
        self.settings = self.settings.model_copy(
            update={"http": self.settings.http.model_copy(update=http)}
        )
        endpoint = self._endpoints["m"]
        self.book = VersionBook(
            "m", endpoint.versions, ServingRecordFile(directory), self.payload,
            lambda: "", lambda *_: None,
        )  # fmt: skip
        self.version_control = self

    def move(self, name: str, move: Any) -> ServingRecord:
        return self.book.move(move)

    @staticmethod
    def payload(s: Snapshot) -> bytes:
        meta = WeightsMeta("m", s.version, 0, s.created_at, None, "fp", s.lineage)
        return encode_weights([str(i) for i in range(len(s.weights))], s.weights, meta)


def serve(runtime: AdminRuntime) -> InProcessServer:
    return InProcessServer(create_app(runtime)).start()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, AdminRuntime]]:
    from pydantic import SecretStr

    http = {"admin_token": SecretStr("admin-secret"), "token": SecretStr("plain")}
    runtime = AdminRuntime(tmp_path_factory.mktemp("admin"), http)
    server = serve(runtime)
    try:
        yield server.url, runtime
    finally:
        server.stop()


def test_without_an_admin_token_configured_the_routes_are_off(tmp_path: Path) -> None:
    server = serve(AdminRuntime(tmp_path, {}))
    try:
        for headers in ({}, ADMIN):
            answer = httpx.put(f"{server.url}/v1/admin/models/m/pin", json={}, headers=headers)
            assert answer.status_code == 403 and "http.admin_token" in answer.json()["error"]
    finally:
        server.stop()


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer plain"},
                                     {"Authorization": "Bearer admin-secret-"}])  # fmt: skip
def test_a_missing_or_wrong_admin_token_is_401(
    served: tuple[str, AdminRuntime], headers: dict[str, str]
) -> None:
    url, _ = served
    for answer in (
        httpx.get(f"{url}/v1/admin/models/m/versions", headers=headers),
        httpx.put(f"{url}/v1/admin/models/m/labels/stable", json={"version": 1}, headers=headers),
    ):
        assert answer.status_code == 401, answer.text


def test_a_label_and_a_pin_choose_what_is_served(served: tuple[str, AdminRuntime]) -> None:
    url, runtime = served
    for version in (1, 2):
        runtime.publish(version)
    put = httpx.put(f"{url}/v1/admin/models/m/labels/stable", json={"version": 1}, headers=ADMIN)
    assert put.status_code == 200, put.text
    assert put.json()["record"]["labels"] == {"stable": 1}
    runtime.publish(3)
    labelled = httpx.post(f"{url}/v1/models/m/labels/stable:predict", json=ROWS)
    assert labelled.json()["model_version"] == "1"
    assert httpx.get(f"{url}/v1/models/m/labels/stable").json()["model_version_status"][0][
        "version"] == "1"  # fmt: skip
    assert httpx.post(f"{url}/v1/models/m:predict", json=ROWS).json()["model_version"] == "3"
    unknown = httpx.post(f"{url}/v1/models/m/labels/gold:predict", json=ROWS)
    assert unknown.status_code == 404 and "latest, stable" in unknown.json()["error"]
    httpx.put(f"{url}/v1/admin/models/m/pin", json={"version": 2}, headers=ADMIN)
    pinned = httpx.post(f"{url}/v1/models/m:predict", json=ROWS)
    assert pinned.json()["model_version"] == "2" and pinned.headers["x-model-version"] == "2"
    assert httpx.delete(f"{url}/v1/admin/models/m/pin", headers=ADMIN).status_code == 200
    assert httpx.post(f"{url}/v1/models/m:predict", json=ROWS).json()["model_version"] == "3"


def test_bodies_are_checked(served: tuple[str, AdminRuntime]) -> None:
    url, _ = served
    for body in ({"version": "x"}, {"version": 1, "extra": 1}, {"version": -1}):
        answer = httpx.put(f"{url}/v1/admin/models/m/labels/x", json=body, headers=ADMIN)
        assert answer.status_code == 400, answer.text
    expired = httpx.put(f"{url}/v1/admin/models/m/labels/x", json={"version": 99}, headers=ADMIN)
    assert expired.status_code == 404 and "kept:" in expired.json()["error"]


@pytest.mark.parametrize(
    "path, body",
    [
        ("labels/x", b'{"version": 1' + b"0" * 400 + b"}"),  # 10**400
        ("labels/x", b'{"version": 4611686018427387904}'),  # 2**62
        ("labels/x", '{"version": "٣"}'.encode()),  # a non-ASCII digit
        ("labels/x", b"\xff\xfe\x00garbage"),
        ("labels/x", b"[]"),
        ("pin", b'{"version": 1e400}'),
        ("rollback", b'{"version": 1, "mode": "sideways"}'),
        ("default", b'{"label": "' + "é".encode() * 3 + b'"}'),
    ],
)
def test_hostile_bodies_are_a_4xx_and_change_nothing(
    served: tuple[str, AdminRuntime], path: str, body: bytes
) -> None:
    url, _ = served
    before = httpx.get(f"{url}/v1/admin/models/m/versions", headers=ADMIN).json()["record"]
    method = "POST" if path == "rollback" else "PUT"
    answer = httpx.request(method, f"{url}/v1/admin/models/m/{path}", content=body,
                           headers={**ADMIN, "content-type": "application/json"})  # fmt: skip
    assert 400 <= answer.status_code < 500, answer.text
    after = httpx.get(f"{url}/v1/admin/models/m/versions", headers=ADMIN).json()["record"]
    assert after == before
