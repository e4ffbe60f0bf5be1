"""``find_model``: the one way the predictions, labels and weights routes find the model a path
names: the token first, then the name."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from livefit.server.http.auth import TokenGuard
from livefit.server.http.model_lookup import find_model
from livefit.server.http.predict_request import ApiError

GUARD = TokenGuard(b"secret")
MODELS = {"beta": object(), "alpha": object()}


def request(token: str | None = None) -> Request:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return Request({"type": "http", "method": "GET", "path": "/", "headers": headers})


def refused(models: dict[str, object], name: str, token: str | None) -> ApiError:
    with pytest.raises(ApiError) as caught:
        find_model(lambda: models, name, request(token), GUARD.check)  # type: ignore[arg-type,return-value]
    return caught.value


def test_the_named_model_behind_the_right_token() -> None:
    found = find_model(lambda: MODELS, "beta", request("secret"), GUARD.check)  # type: ignore[arg-type,return-value]
    assert found is MODELS["beta"]


def test_without_a_guard_no_token_is_asked() -> None:
    assert find_model(lambda: MODELS, "alpha", request(), None) is MODELS["alpha"]  # type: ignore[arg-type,return-value]


@pytest.mark.parametrize("token", [None, "wrong"])
def test_the_token_is_checked_before_the_name(token: str | None) -> None:
    """A caller without the token learns nothing, not even which models exist."""
    for name in ("alpha", "nope"):
        error = refused(MODELS, name, token)
        assert (error.status, error.message) == (401, "missing or wrong bearer token")
        assert error.headers == {"WWW-Authenticate": "Bearer"}


def test_an_unknown_model_is_404_naming_the_models_in_order() -> None:
    error = refused(MODELS, "gamma", "secret")
    assert (error.status, error.message) == (
        404, "unknown model 'gamma'; this server has: alpha, beta"
    )  # fmt: skip


def test_a_server_without_models_says_none() -> None:
    error = refused({}, "alpha", "secret")
    assert error.message == "unknown model 'alpha'; this server has: none"
