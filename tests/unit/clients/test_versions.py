"""`livefit versions` (``clients.versions``) against the admin routes of a real uvicorn-served
app: every action moves the record the learner serves by, the token comes from the option or
the environment, and each failure is one line with its exit status (1: refused or unreachable,
2: no token)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from livefit.cli import main
from livefit.clients.versions import TOKEN_ENV, describe
from tests.inprocess import InProcessServer
from tests.unit.http.test_admin_api import ADMIN, ROWS, AdminRuntime, serve


@pytest.fixture(scope="module")
def learner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, AdminRuntime]]:
    runtime = AdminRuntime(
        tmp_path_factory.mktemp("versions"), {"admin_token": SecretStr("admin-secret")}
    )
    for version in (1, 2, 3):
        runtime.publish(version)
    server: InProcessServer = serve(runtime)
    try:
        yield server.url, runtime
    finally:
        server.stop()


def versions(url: str, *args: str, token: str | None = "admin-secret") -> int:
    """``livefit versions ARGS --url URL [--admin-token TOKEN]``; its exit status."""
    given = ["--admin-token", token] if token is not None else []
    return main(["versions", *args, "--url", url, *given])


def served_version(url: str, path: str = "/v1/models/m:predict") -> str:
    return str(httpx.post(f"{url}{path}", json=ROWS).json()["model_version"])


def test_each_action_moves_what_is_served(
    learner: tuple[str, AdminRuntime], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = learner
    assert versions(url, "label", "m", "stable", "1") == 0
    assert "m: stable=1; the unversioned path serves latest" in capsys.readouterr().out
    assert served_version(url, "/v1/models/m/labels/stable:predict") == "1"
    assert versions(url, "default", "m", "stable") == 0
    assert served_version(url) == "1"
    assert versions(url, "pin", "m", "2") == 0
    assert "pinned to 2" in capsys.readouterr().out
    assert served_version(url) == "2"
    assert versions(url, "unpin", "m") == 0 and served_version(url) == "1"
    assert versions(url, "rollback", "m", "3", "--mode", "serve") == 0
    assert served_version(url) == "3"
    assert versions(url, "unpin", "m") == 0 and versions(url, "unlabel", "m", "stable") == 0
    assert served_version(url) == "3"  # the default label went with it: latest again
    capsys.readouterr()
    assert versions(url, "list", "m") == 0
    listed = capsys.readouterr().out
    assert "newest: 3" in listed and "kept: 3, 2, 1" in listed
    assert "rollback to 3 (serve) as 3" in listed


def test_pin_without_a_version_holds_the_one_served(learner: tuple[str, AdminRuntime]) -> None:
    url, runtime = learner
    assert versions(url, "pin", "m") == 0
    held = served_version(url)
    runtime.publish(int(held) + 1)
    assert served_version(url) == held
    assert versions(url, "unpin", "m") == 0


def test_list_json_is_the_learners_answer(
    learner: tuple[str, AdminRuntime], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = learner
    assert versions(url, "list", "m", "--json") == 0
    document = httpx.get(f"{url}/v1/admin/models/m/versions", headers=ADMIN).json()
    assert httpx.Response(200, content=capsys.readouterr().out).json() == document


def test_the_token_comes_from_the_environment(
    learner: tuple[str, AdminRuntime], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = learner
    monkeypatch.setenv(TOKEN_ENV, "admin-secret")
    assert versions(url, "list", "m", token=None) == 0


@pytest.mark.parametrize(
    ("args", "token", "status", "says"),
    [
        (("list", "m"), None, 2, "an admin token is needed"),
        (("list", "m"), "wrong", 1, "HTTP 401: missing or wrong admin bearer token"),
        (("label", "m", "stable", "99"), "admin-secret", 1, "HTTP 404: version 99 of model m"),
        (("label", "m", "latest", "1"), "admin-secret", 1, "HTTP 400: 'latest' always names"),
        (("unlabel", "m", "gold"), "admin-secret", 1, "HTTP 404: model m has no label 'gold'"),
        (("list", "nope"), "admin-secret", 1, "HTTP 404: "),
        (("rollback", "m", "1", "--mode", "train"), "admin-secret", 1, "HTTP 409: "),
    ],
)
def test_a_refusal_is_one_line_and_a_status(
    learner: tuple[str, AdminRuntime], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], token: str | None, status: int,
    says: str,
) -> None:  # fmt: skip
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    url, _ = learner
    assert versions(url, *args, token=token) == status
    err = capsys.readouterr().err
    assert err.startswith(f"livefit versions: {says}") and err.count("\n") == 1, err


def test_admin_routes_that_are_off_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = serve(AdminRuntime(tmp_path, {}))
    try:
        assert versions(server.url, "list", "m") == 1
        assert "HTTP 403: the admin routes are off" in capsys.readouterr().err
    finally:
        server.stop()


def test_an_unreachable_learner_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert versions("http://127.0.0.1:1", "unpin", "m") == 1
    assert capsys.readouterr().err.startswith("livefit versions: http://127.0.0.1:1 did not")


def test_a_version_is_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["versions", "pin", "m", "x"])
    assert exit_.value.code == 2 and "invalid int value" in capsys.readouterr().err


def test_describe_counts_a_long_list() -> None:
    document = {"record": {"labels": {}, "default": "latest", "sequence": 0},
                "newest": 120, "kept": list(range(120, 0, -1)), "missing": [7]}  # fmt: skip
    text = describe("m", document, listing=True)
    assert "kept: 120, 119" in text and "... 108 more ..., 2, 1" in text
    assert "not arrived yet: 7" in text
