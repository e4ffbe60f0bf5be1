"""The admin routes (``/v1/admin/models/{name}/...``): read a model's serving record and the
versions kept, move a label, choose what the unversioned path serves, pin, unpin, roll back.

Guarded by ``http.admin_token`` (``AdminGuard``): without one configured every admin route
answers 403 whatever is sent, so a deployment that never set it cannot be steered; a missing
or wrong token is 401. Bodies are validated by pydantic (400 naming the field). A move is made
by the process's ``VersionControl`` (the learner's book, a split learner's training process
behind its socket) off the event loop; a replica has none and answers 409: labels are moved on
the learner and reach replicas on the weight stream.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from typing import Any, Literal, Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ..serve.endpoint import ModelEndpoint
from ..serve.version_book import Move, MoveRefused
from ..wire.serving_record import ServingRecord
from .model_lookup import Endpoints, find_model
from .predict_request import ApiError, error_response

VersionText = Field(ge=0, lt=2**63, description="a version kept (in memory or a checkpoint)")


class VersionControl(Protocol):
    """Who makes a move for this process (blocking: called in a worker thread)."""

    def move(self, name: str, move: Move) -> ServingRecord:
        """Make ``move`` on model ``name``; ``MoveRefused`` says why not."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LabelBody(_Body):
    version: int = VersionText


class DefaultBody(_Body):
    label: str = Field(description="`latest`, or a label the unversioned path serves")


class PinBody(_Body):
    version: int | None = Field(None, ge=0, lt=2**63, description="unset: the version served")


class RollbackBody(_Body):
    version: int = VersionText
    mode: Literal["serve", "train"] = "serve"


class AdminGuard:
    """``Authorization: Bearer <http.admin_token>``; with no admin token, nothing passes."""

    def __init__(self, token: bytes | None) -> None:
        self.token = token

    def check(self, request: Request) -> None:
        if self.token is None:
            raise ApiError(403, "the admin routes are off: set http.admin_token to use them")
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                                 self.token):  # fmt: skip
            raise ApiError(
                401, "missing or wrong admin bearer token", {"WWW-Authenticate": "Bearer"}
            )


def build_admin_router(
    endpoints: Endpoints, guard: AdminGuard, control: VersionControl | None
) -> APIRouter:
    """The admin routes over the models ``endpoints()`` returns (module docstring)."""
    router = APIRouter()
    admin = _Admin(endpoints, guard, control)
    prefix = "/v1/admin/models/{name}"

    @router.get(f"{prefix}/versions")
    async def admin_versions(name: str, request: Request) -> JSONResponse:
        """The serving record and the versions this process keeps."""
        return admin.answer(request, name, _versions)

    @router.put(f"{prefix}/labels/{{label}}")
    async def admin_label(name: str, label: str, body: LabelBody, request: Request) -> JSONResponse:
        """Point ``label`` at a kept version (made, or moved)."""
        return await admin.move(request, name, Move("label", label=label, version=body.version))

    @router.delete(f"{prefix}/labels/{{label}}")
    async def admin_unlabel(name: str, label: str, request: Request) -> JSONResponse:
        """Remove ``label`` (the unversioned path serves ``latest`` if it served this one)."""
        return await admin.move(request, name, Move("unlabel", label=label))

    @router.put(f"{prefix}/default")
    async def admin_default(name: str, body: DefaultBody, request: Request) -> JSONResponse:
        """The label the unversioned path serves while nothing is pinned."""
        return await admin.move(request, name, Move("default", label=body.label))

    @router.put(f"{prefix}/pin")
    async def admin_pin(name: str, body: PinBody, request: Request) -> JSONResponse:
        """Serve one version on the unversioned path (training goes on)."""
        return await admin.move(request, name, Move("pin", version=body.version))

    @router.delete(f"{prefix}/pin")
    async def admin_unpin(name: str, request: Request) -> JSONResponse:
        """Serve the default label (``latest`` unless chosen) again."""
        return await admin.move(request, name, Move("unpin"))

    @router.post(f"{prefix}/rollback")
    async def admin_rollback(name: str, body: RollbackBody, request: Request) -> JSONResponse:
        """Back to a kept version: serving holds it (``serve``), or the trainer goes on from it
        as a new version (``train``)."""
        move = Move("rollback", version=body.version, mode=body.mode)
        return await admin.move(request, name, move)

    return router


class _Admin:
    """What the admin routes do: the guard, the model, the move, the answer."""

    def __init__(
        self, endpoints: Endpoints, guard: AdminGuard, control: VersionControl | None
    ) -> None:
        self.endpoints = endpoints
        self.guard = guard
        self.control = control

    def answer(
        self, request: Request, name: str, answer: Callable[[ModelEndpoint], dict[str, Any]]
    ) -> JSONResponse:
        try:
            self.guard.check(request)
            return JSONResponse(answer(find_model(self.endpoints, name, request, None)))
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.headers)

    async def move(self, request: Request, name: str, move: Move) -> JSONResponse:
        try:
            self.guard.check(request)
            model = find_model(self.endpoints, name, request, None)
            if self.control is None:
                raise ApiError(409, "this server follows a learner's weight stream: move labels "
                                    "and pins on the learner; they reach it signed")  # fmt: skip
            record = await asyncio.to_thread(self.control.move, name, move)
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.headers)
        except MoveRefused as exc:
            return error_response(exc.status, exc.message)
        model.versions.apply(record)  # this process serves by it at once; the others on the feed
        return JSONResponse(_versions(model))


def _versions(model: ModelEndpoint) -> dict[str, Any]:
    record = model.versions.record or ServingRecord(model.name, model.versions.lineage())
    current = model.serving.source()
    return {
        "record": record.as_json(),
        "newest": current.version if current is not None else None,
        "kept": model.versions.versions().all(),
        "missing": model.versions.missing(),
    }
