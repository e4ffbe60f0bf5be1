"""What both prediction protocols share (``http.protocol_common``): the parsed request and
the check of outputs against the rows."""

from __future__ import annotations

import numpy as np
import pytest

from livefit.server.http.oip import format_oip
from livefit.server.http.protocol_common import ParsedRequest
from livefit.server.http.tfserving import format_tfserving, parse_tfserving


def test_format_refuses_outputs_that_do_not_match_the_rows() -> None:
    parsed = parse_tfserving(b'{"instances": [[1], [2]]}', [1], 10)
    with pytest.raises(ValueError, match="returned 3 rows of outputs for 2 input rows"):
        format_tfserving(parsed, np.zeros((3, 1)), 1)
    with pytest.raises(ValueError, match="returned a scalar of outputs for 2 input rows"):
        format_oip(parsed, np.float32(1.0), "m", 1)


def test_parsed_request_is_a_frozen_message() -> None:
    parsed = ParsedRequest(rows=np.zeros((1, 1), dtype=np.float32), protocol="oip")
    with pytest.raises(AttributeError):
        parsed.protocol = "tfserving"
    assert parsed.parameters == {} and parsed.tf_format is None
