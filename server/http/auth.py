"""Bearer-token checks for the HTTP API: the token guards what writes into training (labels)
and weight downloads, and predictions too when ``http.protect_predictions`` is set. The token
is compared in constant time and never logged or echoed."""

from __future__ import annotations

import hmac

from fastapi import Request

from .predict_request import ApiError


class TokenGuard:
    """Checks ``Authorization: Bearer <token>``; a guard without a token lets everything in."""

    def __init__(self, token: bytes | None) -> None:
        self.token = token

    def check(self, request: Request) -> None:
        """Raise a 401 ApiError unless the request carries the configured token."""
        if self.token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), self.token
        ):
            raise ApiError(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})

    @property
    def enabled(self) -> bool:
        return self.token is not None

    def headers(self) -> dict[str, str]:
        """What a client of another livefit process sends (replicas pulling weights)."""
        return {"Authorization": f"Bearer {self.token.decode()}"} if self.token else {}
