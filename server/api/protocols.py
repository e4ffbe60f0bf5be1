"""Request and response codecs for the prediction API: TF Serving REST and Open Inference Protocol.

Pure functions, no I/O. The HTTP layer hands in the raw body and gets back float32 rows shaped
``(N, *input_shape)``, or a ``RequestError`` whose ``status`` (400 or 413) and ``message`` tell the
client what to fix; after inference it hands in the outputs and gets back a dict ready for JSON.

Shapes: ``input_shape`` is one example's shape, without the batch dimension. Every request names
the batch first, with two conveniences:

- a model whose input shape ends in 1 also takes rows with that 1 left out, so the TF Serving
  documentation's ``{"instances": [1.0, 2.0, 5.0]}`` is three rows for input shape [1];
- OIP only: a tensor whose shape equals the input shape (same rank, no batch dimension) is one
  row. Rank tells the two apart, so no shape means two things.

Non-finite predictions come back as JSON ``null``: JSON has no NaN, and strict encoders (such as
Starlette's) refuse it. tritonclient reads ``null`` in FP32 data as NaN.

Booleans are not numbers: ``true`` among numbers is refused like ``[true, false]`` is (numpy would
read it as 1). Only the OIP datatype BOOL takes them, and it takes nothing else, as the spec says.

The protocols live in modules of their own and this one re-exports their public names:
``tfserving`` (TF Serving REST), ``oip`` (Open Inference Protocol requests and responses),
``oip_tensors`` (an OIP tensor's data) and ``protocol_common`` (the parsed request, the error,
the JSON reading and writing both share). Callers go through this module
(``protocols.parse_oip``), so a test can replace a function here.
"""

from __future__ import annotations

from livefit.server.api.oip import (
    PLATFORM,
    format_oip,
    oip_model_metadata,
    parse_oip,
    triton_model_config,
)
from livefit.server.api.oip_tensors import OIP_DATATYPES
from livefit.server.api.protocol_common import (
    MAX_RANK,
    ParsedRequest,
    Protocol,
    RequestError,
    TfFormat,
)
from livefit.server.api.tfserving import format_tfserving, parse_tfserving, tfserving_model_status

__all__ = [
    "MAX_RANK",
    "OIP_DATATYPES",
    "PLATFORM",
    "ParsedRequest",
    "Protocol",
    "RequestError",
    "TfFormat",
    "format_oip",
    "format_tfserving",
    "oip_model_metadata",
    "parse_oip",
    "parse_tfserving",
    "tfserving_model_status",
    "triton_model_config",
]
