"""How every route that names a model finds it: the models a process answers for
(``Endpoints``, the runtime's ``endpoints``) and ``find_model``, the token check first (401) and
then the name (404 listing the models), so the predictions, labels and weights routes answer a
wrong token or an unknown model alike; and how a versioned path finds its version
(``path_version``: 400 for what is no version number, ``kept_version``: 404 naming the kept
versions, ``find_version``: the kept version's snapshot, a checkpoint read off the loop); and
what a label or the serving record chose (``find_served``, ``label_version``)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping

from fastapi import Request

from ..serve.endpoint import ModelEndpoint
from ..serve.versions import VersionNotHere, VersionNotKept
from ..wire.snapshot import Snapshot
from .predict_request import ApiError, Guard

Endpoints = Callable[[], Mapping[str, ModelEndpoint]]


def find_model(
    endpoints: Endpoints, name: str, request: Request, guard: Guard | None
) -> ModelEndpoint:
    """The model ``name``, once ``guard`` (if any) lets ``request`` through; else ApiError 401
    (the guard's) or 404 naming the models this process has."""
    if guard is not None:
        guard(request)
    models = endpoints()
    model = models.get(name)
    if model is None:
        known = ", ".join(sorted(models)) or "none"
        raise ApiError(404, f"unknown model {name!r}; this server has: {known}")
    return model


_VERSION = re.compile(r"[0-9]{1,18}")  # ASCII digits only; below 2**63 (int64, as TF Serving)


def path_version(text: str) -> int:
    """The version a path names (``/versions/N``); ApiError 400 unless ``N`` is a whole number
    in ASCII digits (Python's ``int`` would take other scripts' digits, signs and spaces)."""
    if not _VERSION.fullmatch(text):
        shown = ascii(text[:40])
        raise ApiError(400, f"a version is a whole number of at most 18 digits, got {shown}")
    return int(text)


def kept_version(model: ModelEndpoint, text: str) -> int:
    """The version ``text`` names, once it is kept (nothing read from disk); else ApiError
    400 (no version number) or 404 naming the versions kept."""
    version = path_version(text)
    if not model.versions.has(version):
        raise ApiError(404, str(model.versions.not_kept(version)))
    return version


async def find_version(model: ModelEndpoint, text: str) -> Snapshot:
    """The kept snapshot of the version ``text`` names: one in memory at once, a checkpoint
    read from disk in a worker thread; else ApiError 400 or 404 naming the versions kept."""
    version = path_version(text)
    versions = model.versions
    found = versions.get(version)
    if found is None and versions.on_disk(version):
        try:
            found = await asyncio.to_thread(versions.load, version)
        except VersionNotKept as exc:  # pruned or unreadable meanwhile
            raise ApiError(404, str(exc)) from None
    if found is None:
        raise ApiError(404, str(versions.not_kept(version)))
    return found


async def find_served(
    model: ModelEndpoint, version: str | None, label: str | None
) -> Snapshot | None:
    """The kept snapshot a request is computed with: the path's version, else its label's, else
    the one the serving record serves unversioned; None for the newest. ApiError 400 or 404
    (naming the kept versions or the labels), 503 while a named version has not arrived."""
    if version is not None:
        return await find_version(model, version)
    try:
        return model.versions.labelled(label) if label is not None else model.versions.served()
    except KeyError as exc:
        raise ApiError(404, str(exc.args[0])) from None
    except VersionNotHere as exc:
        raise ApiError(503, str(exc), {"Retry-After": "1"}) from None


def label_version(model: ModelEndpoint, label: str) -> int:
    """The version ``label`` names now (``latest``: the newest); ApiError 404 naming the labels,
    503 before any weights or while the version has not arrived."""
    try:
        found = model.versions.labelled(label) or model.versions.latest()
    except KeyError as exc:
        raise ApiError(404, str(exc.args[0])) from None
    except VersionNotHere as exc:
        raise ApiError(503, str(exc), {"Retry-After": "1"}) from None
    if found is None:
        raise ApiError(503, f"model {model.name} has no weights yet", {"Retry-After": "1"})
    return found.version
