"""The engine's response headers on their way to the client: hop-by-hop ones stay on the
proxy's hop, including every header the engine's ``Connection`` header names (RFC 9110 §7.6.1),
on the guarded and the pass-through routes alike."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from proxy.server.asgi import response_headers
from tests.conftest import CannedEngine

ProxyFactory = Callable[..., str]
ENGINE = "http://127.0.0.1:8000"


def test_headers_named_in_connection_are_dropped() -> None:
    """Names in ``Connection`` are matched case-insensitively, with spaces and empty list
    members tolerated; headers not named pass unchanged and in order."""
    raw = [
        (b"Content-Type", b"application/json"),
        (b"X-Hop-Secret", b"for the proxy only"),
        (b"Connection", b"keep-alive, X-Hop-Secret,, x-other-HOP "),
        (b"x-other-hop", b"1"),
        (b"x-kept", b"2"),
    ]
    assert response_headers(raw, ENGINE, keep_length=True) == [
        (b"Content-Type", b"application/json"),
        (b"x-kept", b"2"),
    ]


def test_connection_header_in_any_position_applies_to_earlier_headers() -> None:
    """The header the ``Connection`` header names may come before it."""
    raw = iter([(b"x-a", b"1"), (b"x-b", b"2"), (b"connection", b"x-a")])
    assert response_headers(raw, ENGINE, keep_length=False) == [(b"x-b", b"2")]


def _answer(extra: bytes, status: bytes = b"200 OK") -> bytes:
    body = b'{"object":"list","data":[]}'
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body
    )


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/messages")],
)
def test_connection_named_headers_never_reach_the_client(
    canned_engine: Callable[[bytes], CannedEngine],
    proxy_server: ProxyFactory,
    method: str,
    path: str,
) -> None:
    """Pass-through and guarded routes (an engine 4xx is relayed as it is) drop what the
    engine's ``Connection`` names and keep the rest of its headers."""
    engine = canned_engine(
        _answer(
            b"connection: close, x-engine-internal\r\nx-engine-internal: 10.0.0.7\r\n"
            b"x-engine-public: yes\r\n",
            status=b"400 Bad Request" if method == "POST" else b"200 OK",
        )
    )
    base = proxy_server(upstream_url=engine.url)
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
    r = httpx.request(method, base + path, json=body if method == "POST" else None)
    assert r.status_code == (400 if method == "POST" else 200)
    assert "x-engine-internal" not in r.headers
    assert r.headers["x-engine-public"] == "yes"
    assert r.json() == {"object": "list", "data": []}
