"""What a prediction request's HTTP parts mean: the error answer (``ApiError``,
``error_response``), the body read within its byte and time limits, the deadline from the
``X-Deadline-Ms`` header or OIP's ``timeout`` parameter, numbers read by ASCII rules, and the
TF Serving and OIP parse and format steps over ``tfserving`` and ``oip``.

This module owns those steps and the constants they use; ``predict_handlers`` puts them
together, ``predict_api`` routes to them and ``early_admission`` reads the deadline header by
the same rule (``positive_decimal``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from ..serve.endpoint import ModelEndpoint
from .oip import format_oip, parse_oip
from .openapi_docs import BYTE_COUNT_PATTERN, DECIMAL_PATTERN
from .protocol_common import ParsedRequest
from .tfserving import format_tfserving, parse_tfserving

log = logging.getLogger(__name__)
DEADLINE_HEADER = "x-deadline-ms"
OIP_HEADER_LENGTH = "inference-header-content-length"  # the binary-data extension
MAX_DEADLINE_S = 600.0
CLIENT_GONE = 499  # counted (as nginx logs it), never sent: the client disconnected mid-body
_BYTE_COUNT = re.compile(BYTE_COUNT_PATTERN)  # used with fullmatch
_DECIMAL = re.compile(DECIMAL_PATTERN)
_MAX_TIMEOUT_US = 2**63 - 1  # the OIP timeout is an int64 (Triton: uint64) of microseconds
Parser = Callable[[bytes, ModelEndpoint, Request], ParsedRequest]
Formatter = Callable[[ParsedRequest, ModelEndpoint, Any, int], dict[str, Any]]
Guard = Callable[[Request], None]


class ApiError(Exception):
    """An error answer: HTTP ``status`` and a message for the user."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    # A message quoting the client's text may hold lone surrogates, which UTF-8 cannot encode.
    safe = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse({"error": safe}, status_code=status, headers=headers)


def positive_decimal(text: str) -> float | None:
    """``text`` as a positive number when it is a decimal in ASCII digits (as the
    ``X-Deadline-Ms`` header must be), else None."""
    if not _DECIMAL.fullmatch(text):
        return None
    number = float(text)
    return number if number > 0 else None


def parse_tf(body: bytes, model: ModelEndpoint, request: Request) -> ParsedRequest:
    """The TF Serving ``Parser``: a ``:predict`` body for ``model``."""
    s = model.settings
    return parse_tfserving(body, s.input_shape, s.serve.max_request_rows)


def format_tf(
    parsed: ParsedRequest, model: ModelEndpoint, outputs: Any, version: int
) -> dict[str, Any]:
    """The TF Serving ``Formatter``: the ``:predict`` answer."""
    return format_tfserving(parsed, outputs, version)


def parse_v2(body: bytes, model: ModelEndpoint, request: Request) -> ParsedRequest:
    """The OIP ``Parser``: an ``/infer`` body for ``model``, its binary part split off by the
    Inference-Header-Content-Length header."""
    s = model.settings
    header = request.headers.get(OIP_HEADER_LENGTH)
    if header is not None and not _BYTE_COUNT.fullmatch(header):
        raise ApiError(
            400,
            f"{OIP_HEADER_LENGTH} must be a byte count in ASCII digits (the length of the "
            f"JSON part of the body), got {_shown(header)}",
        )
    return parse_oip(
        body,
        s.input_shape,
        s.serve.max_request_rows,
        header_length=int(header) if header is not None else None,
    )


def format_v2(
    parsed: ParsedRequest, model: ModelEndpoint, outputs: Any, version: int
) -> dict[str, Any]:
    """The OIP ``Formatter``: the ``/infer`` answer."""
    return format_oip(parsed, outputs, model.name, version)


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body, refused with 413 past ``limit`` bytes and 408 when it trickles in too slowly."""
    declared = request.headers.get("content-length")
    if declared is not None and _BYTE_COUNT.fullmatch(declared) and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes exceeds max_request_bytes={limit}")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, f"request body exceeds max_request_bytes={limit}")
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(408, f"request body not received within {timeout_s:g} s") from None
    except ClientDisconnect:
        log.debug("client disconnected after %d bytes of the body of %s", size, request.url.path)
        raise ApiError(CLIENT_GONE, "client disconnected before the body arrived") from None
    return b"".join(chunks)


def deadline_s(request: Request, parsed: ParsedRequest, model: ModelEndpoint) -> float:
    """The request's deadline: the model default, shortened by X-Deadline-Ms or OIP ``timeout``.

    Like Triton, a request may only shorten the configured default, never lengthen it.
    """
    default = model.settings.serve.default_deadline_ms / 1000.0
    requested: float | None = None
    header = request.headers.get(DEADLINE_HEADER)
    if header is not None:
        requested = _positive(header, f"{DEADLINE_HEADER} header (milliseconds)") / 1000.0
    timeout_us = (parsed.parameters or {}).get("timeout")
    if timeout_us is not None:
        requested = (
            _positive(timeout_us, "parameters.timeout (microseconds)", _MAX_TIMEOUT_US) / 1e6
        )
    return min(default, requested) if requested is not None else default


def _positive(value: Any, what: str, maximum: float = math.inf) -> float:
    """A positive number up to ``maximum`` (finite) from a JSON number (not a boolean) or a
    decimal string in ASCII digits; anything else is a 400. Never ``float()`` of a huge int
    (OverflowError) or of other scripts' digits (which ``float`` reads)."""
    number: float | None = None
    if type(value) is int:  # compared as an int first: no OverflowError, no rounding
        number = float(value) if 0 < value <= maximum else None
    elif type(value) is float:
        number = value
    elif isinstance(value, str) and _DECIMAL.fullmatch(value):
        number = float(value)
    if number is None or not 0 < number < math.inf or (type(value) is not int and number > maximum):
        bound = "" if maximum == math.inf else f" of at most {maximum}"
        raise ApiError(400, f"{what} must be a positive number{bound}, got {_shown(value)}")
    return number


def _shown(value: Any, limit: int = 60) -> str:
    """``value`` for an error message: its repr (ASCII escapes), cut at ``limit`` characters."""
    text = ascii(value) if not isinstance(value, int) or abs(value) < 10**limit else "a huge int"
    return text if len(text) <= limit else text[:limit] + "..."
