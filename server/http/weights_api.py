"""``GET /v1/models/{name}/weights``: the current snapshot (or a recent version) as safetensors;
``GET /v1/models/{name}/description``: the network's description at that snapshot, as JSON;
``GET /v1/models/{name}/export/onnx``: that snapshot as an ONNX file (``export_cache``).

Replicas pull from here when a snapshot is too large to publish inline (the manifest on MQTT
names the version, and binds it by size and sha256 in its signed header); people and tools can
fetch weights the same way. Headers carry the version, lineage and sha256 (also as the ETag;
``If-None-Match`` with it answers 304), and ``X-Weights-Envelope``: base64 of the signed
envelope without its body, so a client holding the learner's public key verifies the payload
as the weight topic's receivers do (``weights.poller``).
The description is the one the snapshot carries in its safetensors metadata (what the signed
envelope bound), so a runtime without livefit can pair it with the weights of the same version.

A split learner's serving process gets each snapshot over its local feed a moment after the
training process names it on the weight topic: a replica pulling the version a manifest named
can ask before it arrived. There (``wait_newer_s`` > 0) a ``?version=N`` newer than every kept
version waits for it up to ``wait_newer_s``, and is 404 only if it did not come (or a newer one
came instead). At most ``MAX_WAITING`` requests wait at once; past that a version not held is
404 at once, so requests for versions that will never come cannot pile up polling the store.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response

from livefit.models.description import DescriptionError
from livefit.models.export import ONNX_CONTENT_TYPE, ExportUnavailable

from ..weights.format import WEIGHTS_CONTENT_TYPE, payload_description
from ..weights.store import EncodedWeights, WeightStore
from .export_cache import EXPORTERS, ExportCache
from .model_lookup import Endpoints, find_model
from .predict_request import ApiError, Guard, error_response

StoreLookup = Callable[[str], WeightStore | None]
MAX_WAITING = 16  # pulls waiting for a version on its way, per serving process
POLL_S = 0.02


def build_weights_router(
    store_for: StoreLookup,
    endpoints: Endpoints,
    guard: Guard | None = None,
    wait_newer_s: float = 0.0,
) -> APIRouter:
    router = APIRouter()
    exports = ExportCache()
    waiting = [0]  # requests in _arriving now (one event loop: no lock needed)

    async def kept(name: str, request: Request, version: int | None) -> EncodedWeights | Response:
        """The kept snapshot a request names, or the error response that says why not."""
        try:
            find_model(endpoints, name, request, guard)
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.headers)
        store = store_for(name)
        item = store.get(version) if store is not None else None
        if (
            item is None
            and store is not None
            and version is not None
            and wait_newer_s > 0
            and waiting[0] < MAX_WAITING
        ):
            waiting[0] += 1
            try:
                item = await _arriving(store, version, wait_newer_s)
            finally:
                waiting[0] -= 1
        if item is None:
            if version is None:
                return error_response(503, f"model {name} has no weights yet", {"Retry-After": "1"})
            newest = store.get() if store is not None else None
            hint = f"; newest is {newest.version}" if newest is not None else ""
            return error_response(404, f"version {version} of {name} is no longer kept{hint}")
        return item

    @router.get("/v1/models/{name}/weights")
    async def weights(name: str, request: Request, version: int | None = None) -> Response:
        """The newest snapshot, or ``?version=N`` while it is among the last few kept."""
        item = await kept(name, request, version)
        if isinstance(item, Response):
            return item
        headers = _headers(item)
        if item.envelope:
            headers["X-Weights-Envelope"] = base64.b64encode(item.envelope).decode()
        if request.headers.get("if-none-match") == headers["ETag"]:
            return Response(status_code=304, headers=headers)
        return Response(item.payload, media_type=WEIGHTS_CONTENT_TYPE, headers=headers)

    @router.get("/v1/models/{name}/description")
    async def description(name: str, request: Request, version: int | None = None) -> Response:
        """The network's description at the newest (or ``?version=N``) kept snapshot, as JSON:
        ``{"model", "version", "lineage", "weights_sha256", "description"}``."""
        item = await kept(name, request, version)
        if isinstance(item, Response):
            return item
        text = payload_description(item.payload)
        if not text:
            return error_response(
                404, f"version {item.version} of {name} carries no description (its learner "
                "is older than descriptions)",
            )  # fmt: skip
        head = json.dumps({"model": name, "version": item.version, "lineage": item.lineage,
                           "weights_sha256": item.sha256})  # fmt: skip
        body = f'{head[:-1]},"description":{text}}}'  # the signed text, byte for byte
        return Response(body, media_type="application/json", headers=_headers(item))

    @router.get("/v1/models/{name}/export/{fmt}")
    async def export(name: str, fmt: str, request: Request, version: int | None = None) -> Response:
        """The newest (or ``?version=N``) kept snapshot as a file another runtime loads
        (``onnx``), made on the first request and cached per version."""
        if fmt not in EXPORTERS:
            return error_response(404, f"unknown export format {fmt!r}; formats: "
                                  f"{', '.join(EXPORTERS)}")  # fmt: skip
        item = await kept(name, request, version)
        if isinstance(item, Response):
            return item
        if not payload_description(item.payload):
            return error_response(404, f"version {item.version} of {name} carries no "
                                  "description to export from")  # fmt: skip
        try:
            made = await exports.get(name, item, fmt)
        except ExportUnavailable as exc:
            return error_response(501, str(exc))
        except DescriptionError as exc:
            return error_response(422, f"cannot export {name} v{item.version}: {exc}")
        headers = {**_headers(item), "X-Export-Seconds": f"{made.seconds:.3f}",
                   "X-Export-Cache": "hit" if made.cached else "miss"}  # fmt: skip
        return Response(made.data, media_type=ONNX_CONTENT_TYPE, headers=headers)

    return router


def _headers(item: EncodedWeights) -> dict[str, str]:
    return {
        "X-Model-Version": str(item.version),
        "X-Weights-Lineage": item.lineage,
        "X-Weights-Sha256": item.sha256,
        "ETag": f'"{item.sha256}"',
        "Cache-Control": "no-cache",
    }


async def _arriving(store: WeightStore, version: int, timeout: float) -> EncodedWeights | None:
    """``version`` once the store has it; None when a version at least as new came without it,
    or ``timeout`` passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        newest = store.get()
        if newest is not None and newest.version >= version:
            return store.get(version)
        if loop.time() >= deadline:
            return None
        await asyncio.sleep(POLL_S)
