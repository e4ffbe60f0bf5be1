"""How every route that names a model finds it: the models a process answers for
(``Endpoints``, the runtime's ``endpoints``) and ``find_model``, the token check first (401) and
then the name (404 listing the models), so the predictions, labels and weights routes answer a
wrong token or an unknown model alike."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fastapi import Request

from ..serve.endpoint import ModelEndpoint
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
