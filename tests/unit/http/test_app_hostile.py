"""Hostile and broken HTTP input against a real uvicorn: tokens, slow and oversized bodies,
malformed JSON, numbers no parser should trust (huge integers, non-ASCII digits, overflowing
parameters), binary-extension headers that lie about lengths, clients that vanish mid-body.
Never a 5xx, never a hang, limits enforced, secrets never echoed, every error JSON."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from livefit.clients.metrics import MetricsReader
from livefit.server.http import predict_request
from livefit.server.http.app import create_app
from tests.inprocess import InProcessServer
from tests.stub_runtime import StubRuntime

TOKEN = "s3cret-token-value"


@pytest.fixture
def guarded() -> Iterator[InProcessServer]:
    runtime = StubRuntime(http={"token": TOKEN, "protect_predictions": True, "body_timeout_s": 0.5})
    server = InProcessServer(create_app(runtime)).start()
    runtime.publish(1)
    yield server
    server.stop()


def predict(
    server: InProcessServer, headers: dict[str, str] | None = None, body: bytes | None = None
) -> httpx.Response:
    content = body if body is not None else b'{"instances": [[0.5, 0.5]]}'
    return httpx.post(
        f"{server.url}/v1/models/m:predict", content=content, headers=headers, timeout=10
    )


def test_token_guards_predictions_and_weights(guarded: InProcessServer) -> None:
    for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        response = predict(guarded, headers)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert TOKEN not in response.text
    ok = predict(guarded, {"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200
    assert httpx.get(f"{guarded.url}/v2/models/m").status_code == 401
    assert httpx.get(f"{guarded.url}/v2/models").status_code == 401
    listed = httpx.get(f"{guarded.url}/v2/models", headers={"Authorization": f"Bearer {TOKEN}"})
    assert listed.json() == {"models": [{"name": "m", "version": "1", "ready": True}]}
    assert httpx.get(f"{guarded.url}/v1/models/m/weights").status_code == 401
    assert httpx.get(f"{guarded.url}/v2/health/live").status_code == 200  # probes stay open
    assert httpx.get(f"{guarded.url}/metrics").status_code == 200


def test_slow_body_gets_408_and_the_server_keeps_serving(guarded: InProcessServer) -> None:
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n".encode()
            + b'{"instances": '
        )
        started = time.monotonic()
        answer = sock.recv(4096).decode(errors="replace")
        assert time.monotonic() - started < 5
    assert answer.startswith("HTTP/1.1 408") and "not received within" in answer
    assert predict(guarded, {"Authorization": f"Bearer {TOKEN}"}).status_code == 200


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"", 400),
        (b"null", 400),
        (b"[]", 400),
        (b'{"instances": ', 400),
        (b"\xff\xfe\x00garbage", 400),
        (b'{"instances": [[1, 2]], "inputs": [[1, 2]]}', 400),
        (b'{"instances": "' + b"a" * 9_000_000 + b'"}', 413),
        (b'{"instances": [' + b"[" * 5000 + b"]" * 5000 + b"]}", 400),
    ],
)
def test_broken_bodies_get_4xx(guarded: InProcessServer, body: bytes, status: int) -> None:
    response = predict(guarded, {"Authorization": f"Bearer {TOKEN}"}, body)
    assert response.status_code == status, response.text[:200]
    assert "error" in response.json()


# --- malformed numbers, headers and bodies: always a 4xx, never a 5xx -----------------------------


@pytest.fixture(scope="module")
def open_server() -> Iterator[InProcessServer]:
    """No token: every request reaches the parsers."""
    runtime = StubRuntime(http={"body_timeout_s": 2})
    server = InProcessServer(create_app(runtime)).start()
    runtime.publish(1)
    yield server
    server.stop()


def raw_request(
    server: InProcessServer, method: bytes, path: bytes, body: bytes, headers: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """One request with byte-exact headers (httpx refuses non-ASCII ones), as a client may send."""
    head = (
        method + b" " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + b"Content-Length: " + str(len(body)).encode() + b"\r\n" + headers + b"\r\n"
    )  # fmt: skip
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    header_block, _, payload = rest.partition(b"\r\n\r\n")
    fields = dict(
        line.decode("latin-1").lower().split(": ", 1) for line in header_block.split(b"\r\n")
    )
    return int(status_line.split()[1]), fields, payload


def oip(tensor: dict[str, object] | None = None, **document: object) -> bytes:
    base = {"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}
    return json.dumps({"inputs": [base | (tensor or {})], **document}).encode()


V1, V2 = b"/v1/models/m:predict", b"/v2/models/m/infer"
IHCL = b"Inference-Header-Content-Length: "
OIP_OK = oip()
OIP_BINARY = oip({"data": None, "parameters": {"binary_data_size": 8}}).replace(
    b', "data": null', b""
)
MALFORMED = {
    # Python's int-from-string digit limit raised ValueError inside the JSON parser: 500.
    "tf_5000_digit_integer": (V1, b'{"instances": [[' + b"1" * 5000 + b", 1]]}", b"", 400),
    "oip_5000_digit_integer": (V2, OIP_OK[:-1] + b', "x": ' + b"9" * 5000 + b"}", b"", 400),
    "tf_401_digit_integer": (V1, b'{"instances": [[' + b"1" * 401 + b", 1]]}", b"", 400),
    "tf_1e308": (V1, b'{"instances": [[1e308, 1]]}', b"", 400),
    "tf_non_ascii_digit_strings": (V1, '{"instances": [["\u0661", "\u00b2"]]}'.encode(), b"", 400),
    "tf_true_and_a_number": (V1, b'{"instances": [[true, 1]]}', b"", 400),
    "tf_columns_false_and_a_number": (V1, b'{"inputs": [[2.5, false]]}', b"", 400),
    "oip_fp32_true_and_a_number": (V2, oip({"data": [True, 2]}), b"", 400),
    "oip_int32_true_and_a_number": (V2, oip({"datatype": "INT32", "data": [1, True]}), b"", 400),
    "oip_bool_true_and_a_number": (V2, oip({"datatype": "BOOL", "data": [True, 1]}), b"", 400),
    "oip_bool_as_the_spec_says": (V2, oip({"datatype": "BOOL", "data": [True, False]}), b"", 200),
    # The OIP timeout parameter (microseconds): float() of a 401-digit int is an OverflowError.
    "oip_timeout_401_digits": (V2, oip(parameters={"timeout": 10**400}), b"", 400),
    "oip_timeout_minus_401_digits": (V2, oip(parameters={"timeout": -(10**400)}), b"", 400),
    "oip_timeout_true": (V2, oip(parameters={"timeout": True}), b"", 400),
    "oip_timeout_arabic_digits": (V2, oip(parameters={"timeout": "\u0661\u0662\u0663"}), b"", 400),
    "oip_timeout_fullwidth_digits": (V2, oip(parameters={"timeout": "\uff11\uff12\uff13"}), b"", 400),
    "oip_timeout_nan_string": (V2, oip(parameters={"timeout": "nan"}), b"", 400),
    "oip_timeout_list": (V2, oip(parameters={"timeout": [1] * 10_000}), b"", 400),
    "oip_timeout_1e308": (V2, oip(parameters={"timeout": 1e308}), b"", 400),
    "oip_timeout_int64_max": (V2, oip(parameters={"timeout": 2**63 - 1}), b"", 200),
    "oip_timeout_past_int64": (V2, oip(parameters={"timeout": 2**63}), b"", 400),
    "oip_timeout_decimal_string": (V2, oip(parameters={"timeout": "5000000"}), b"", 200),
    "oip_shape_product_overflows": (V2, oip({"shape": [1, 2**62, 0, 2**62], "data": []}), b"", 400),
    "oip_shape_401_digits": (V2, oip({"shape": [10**400, 2]}), b"", 413),
    "oip_shape_rank_100": (V2, oip({"shape": [1] * 99 + [2]}), b"", 400),
    "oip_binary_size_401_digits": (V2, oip({"parameters": {"binary_data_size": 10**400}}), b"", 400),
    "oip_id_lone_surrogate": (V2, oip(id="\ud800"), b"", 400),
    "oip_output_lone_surrogate": (V2, oip(outputs=[{"name": "\udfff"}]), b"", 400),
    # Inference-Header-Content-Length: "\u00b2" passed str.isdigit() and int() raised: 500.
    "ihcl_superscript_two": (V2, OIP_BINARY + bytes(8), IHCL + b"\xb2\r\n", 400),
    "ihcl_5000_digits": (V2, OIP_BINARY + bytes(8), IHCL + b"9" * 5000 + b"\r\n", 400),
    "ihcl_too_long": (V2, OIP_BINARY + bytes(8), IHCL + b"%d\r\n" % (len(OIP_BINARY) + 9), 400),
    "ihcl_too_short": (V2, OIP_BINARY + bytes(8), IHCL + b"%d\r\n" % (len(OIP_BINARY) - 3), 400),
    "ihcl_zero": (V2, OIP_BINARY + bytes(8), IHCL + b"0\r\n", 400),
    "ihcl_negative": (V2, OIP_BINARY + bytes(8), IHCL + b"-1\r\n", 400),
    "ihcl_plus_sign": (V2, OIP_BINARY + bytes(8), IHCL + b"+%d\r\n" % len(OIP_BINARY), 400),
    "ihcl_arabic_digits": (V2, OIP_BINARY + bytes(8), IHCL + "\u0663".encode() + b"\r\n", 400),
    "ihcl_fullwidth_digits": (V2, OIP_BINARY + bytes(8), IHCL + "\uff13".encode() + b"\r\n", 400),
    "ihcl_empty": (V2, OIP_BINARY + bytes(8), IHCL + b"\r\n", 400),
    "ihcl_right": (V2, OIP_BINARY + bytes(8), IHCL + b"%d\r\n" % len(OIP_BINARY), 200),
    "deadline_superscript": (V2, OIP_OK, b"X-Deadline-Ms: \xb9\r\n", 400),
    "deadline_5000_digits": (V1, b'{"instances": [[1, 2]]}', b"X-Deadline-Ms: " + b"9" * 5000 + b"\r\n", 400),
    "deadline_nan": (V1, b'{"instances": [[1, 2]]}', b"X-Deadline-Ms: nan\r\n", 400),
    "deadline_negative": (V1, b'{"instances": [[1, 2]]}', b"X-Deadline-Ms: -5\r\n", 400),
    "deadline_as_our_client_sends_it": (V1, b'{"instances": [[1, 2]]}', b"X-Deadline-Ms: 2500.0\r\n", 200),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_requests_get_4xx_with_a_message(open_server: InProcessServer, case: str) -> None:
    path, body, headers, expected = MALFORMED[case]
    status, fields, payload = raw_request(open_server, b"POST", path, body, headers)
    assert status == expected, payload[:300]
    if expected >= 400:
        message = json.loads(payload)["error"]
        assert isinstance(message, str) and 0 < len(message) < 1000
    assert fields["content-type"] == "application/json"


def five_hundreds(metrics: MetricsReader) -> float:
    return sum(
        value
        for (name, labels), value in metrics.samples().items()
        if name == "livefit_predict_requests_total" and dict(labels)["code"].startswith("5")
    )


def test_malformed_requests_count_as_4xx_never_5xx(open_server: InProcessServer) -> None:
    metrics = MetricsReader(open_server.url)
    before_5xx = five_hundreds(metrics)
    before_400 = metrics.value("livefit_predict_requests_total", model="m", code="400")
    for path, body, headers, _ in MALFORMED.values():
        raw_request(open_server, b"POST", path, body, headers)
    assert five_hundreds(metrics) == before_5xx
    rejected = sum(1 for case in MALFORMED.values() if case[3] == 400)
    assert metrics.value("livefit_predict_requests_total", model="m", code="400") == (
        before_400 + rejected
    )


def test_get_on_predict_is_405_with_allow(open_server: InProcessServer) -> None:
    for path in ("/v1/models/m:predict", "/v1/models/ghost:predict"):
        response = httpx.get(f"{open_server.url}{path}")
        assert response.status_code == 405, response.text
        assert response.headers["allow"] == "POST"
        assert "POST" in response.json()["error"]
    assert httpx.get(f"{open_server.url}/v1/models/m").status_code == 200  # status still works
    assert httpx.get(f"{open_server.url}/v2/models/m/infer").headers["allow"] == "POST"


def test_an_unforeseen_exception_is_a_counted_json_500(
    open_server: InProcessServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("formatter bug\nsecond line")

    monkeypatch.setattr(predict_request, "format_tfserving", broken)
    metrics = MetricsReader(open_server.url)
    before = metrics.value("livefit_predict_requests_total", model="m", code="500")
    with caplog.at_level(logging.INFO, logger="livefit.server.http.predict_handlers"):
        response = httpx.post(
            f"{open_server.url}/v1/models/m:predict", content=b'{"instances": [[1, 2]]}'
        )
    assert response.status_code == 500
    assert "RuntimeError" in response.json()["error"]
    assert metrics.value("livefit_predict_requests_total", model="m", code="500") == before + 1
    records = [r for r in caplog.records if r.name == "livefit.server.http.predict_handlers"]
    assert len(records) == 1 and records[0].levelno == logging.ERROR
    line = records[0].getMessage()
    assert "RuntimeError" in line and "formatter bug" in line and "\n" not in line
    assert records[0].exc_info is None


def test_a_client_gone_mid_body_is_one_quiet_line(
    open_server: InProcessServer, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = MetricsReader(open_server.url)
    before = metrics.value("livefit_predict_requests_total", model="m", code="499")
    with caplog.at_level(logging.DEBUG):
        with socket.create_connection(("127.0.0.1", open_server.port), timeout=5) as sock:
            sock.sendall(
                b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
                + b'{"instances": '
            )
            time.sleep(0.2)  # the server is reading the body
        deadline = time.monotonic() + 5
        while metrics.value("livefit_predict_requests_total", model="m", code="499") == before:
            assert time.monotonic() < deadline, "the disconnect was not counted"
            time.sleep(0.05)
        time.sleep(0.2)  # anything logged after the count is in too
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    ours = [r for r in caplog.records if r.name == "livefit.server.http.predict_request"]
    assert len(ours) == 1 and ours[0].levelno <= logging.INFO and ours[0].exc_info is None
    assert "disconnected" in ours[0].getMessage()
