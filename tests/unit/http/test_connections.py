"""``LimitedHttpProtocol`` in process, on a stand-in transport: a request refused from its head
builds no ASGI scope (uvicorn's ``on_message_begin`` work, 0.7 µs of the ~6 µs of Python a
refusal costs), and one that goes on to the app gets the scope uvicorn would have built."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from livefit.server.http.connection_limits import ConnectionLimits
from livefit.server.http.connection_table import ConnectionTable
from livefit.server.http.connections import LimitedHttpProtocol

ANSWER = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 2\r\nretry-after: 1\r\n\r\n{}"
BODY = b'{"instances": [[1.0, 2.0]]}'
REQUEST = (
    b"POST /v1/models/m:predict?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
    b"Content-Type: application/json\r\nX-Deadline-Ms: 100\r\n"
    b"Content-Length: %d\r\n\r\n" % len(BODY)
) + BODY


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5000)}.get(name, default)

    def write(self, data: bytes) -> None:  # type: ignore[override]
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _protocol(answer: bytes | None, scopes: list[dict[str, Any]]) -> tuple[Any, _Transport]:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        scopes.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    table = ConnectionTable(ConnectionLimits(10, 5, 100, 8192), None, lambda m, u, h: answer)
    cls = type("P", (LimitedHttpProtocol,), {"table": table})
    config = uvicorn.Config(app=app, http=cls, lifespan="off", log_level="warning")
    config.load()
    loop = asyncio.get_running_loop()
    protocol = cls(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    transport = _Transport()
    protocol.connection_made(transport)
    return protocol, transport


def test_a_request_refused_from_its_head_builds_no_asgi_scope(monkeypatch: Any) -> None:
    asyncio.run(_refused_builds_no_scope(monkeypatch))


async def _refused_builds_no_scope(monkeypatch: Any) -> None:
    built: list[object] = []
    original = HttpToolsProtocol.on_message_begin

    def counted(self: HttpToolsProtocol) -> None:
        built.append(self)
        original(self)

    monkeypatch.setattr(HttpToolsProtocol, "on_message_begin", counted)
    protocol, transport = _protocol(ANSWER, [])
    for _ in range(3):  # keep-alive: three requests on one connection, each refused
        protocol.data_received(REQUEST)
    assert transport.written == [ANSWER] * 3
    assert built == []


def test_a_request_for_the_app_gets_uvicorns_scope() -> None:
    asyncio.run(_app_gets_the_scope())


async def _app_gets_the_scope() -> None:
    scopes: list[dict[str, Any]] = []
    protocol, transport = _protocol(None, scopes)
    protocol.data_received(REQUEST)
    for _ in range(20):
        if transport.written:
            break
        await asyncio.sleep(0.01)
    assert len(scopes) == 1
    scope = scopes[0]
    assert scope["method"] == "POST" and scope["path"] == "/v1/models/m:predict"
    assert scope["query_string"] == b"x=1" and scope["client"] == ("127.0.0.1", 5000)
    assert (b"x-deadline-ms", b"100") in scope["headers"]
    assert (b"content-type", b"application/json") in scope["headers"]
    assert transport.written[0].startswith(b"HTTP/1.1 200 OK")
