"""What of the client's request reaches the engine, on guarded and pass-through routes: never a
client credential when the proxy holds the engine's key, never a header a ``Connection`` header
names (however many there are), never a credential other than the one the proxy checked, and
no encoding the client did not ask for. Real sockets on both sides: the client writes its
request head byte by byte, the engine records the head it got."""

from __future__ import annotations

import socket
from collections.abc import Callable

import httpx
import pytest

from tests.conftest import CannedEngine
from tests.net import HANG_GUARD

ProxyFactory = Callable[..., str]
EngineFactory = Callable[[bytes], CannedEngine]

_ERROR = b'{"error":{"message":"no","type":"BadRequestError","code":400}}'
#: Every request gets the same small JSON error: the tests look at what the engine received.
ANSWER = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: "
    + str(len(_ERROR)).encode()
    + b"\r\n\r\n"
    + _ERROR
)
CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'
MESSAGES = b'{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}'
ROUTES = [
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/messages", MESSAGES),
    ("GET", "/v1/models", b""),
]


def raw_request(base: str, method: str, path: str, headers: list[bytes], body: bytes) -> bytes:
    """Send exactly these header lines (repeats included) and return the whole answer."""
    host, port = base.removeprefix("http://").split(":")
    head = [f"{method} {path} HTTP/1.1".encode(), b"host: " + host.encode(), *headers]
    if body or method == "POST":
        head += [b"content-type: application/json", b"content-length: %d" % len(body)]
    head.append(b"connection: close")
    with socket.create_connection((host, int(port)), timeout=HANG_GUARD) as sock:
        sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        out = b""
        while part := sock.recv(65536):
            out += part
    return out


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=["chat", "messages", "models"])
def test_client_credentials_never_reach_the_engine_when_the_proxy_holds_its_key(
    proxy_server: ProxyFactory,
    canned_engine: EngineFactory,
    method: str,
    path: str,
    body: bytes,
) -> None:
    engine = canned_engine(ANSWER)
    base = proxy_server(upstream_url=engine.url, upstream_api_key="engine-key")
    answer = raw_request(
        base,
        method,
        path,
        [b"x-api-key: client-secret", b"authorization: Bearer client-bearer"],
        body,
    )
    assert status_of(answer) == 400
    (head,) = engine.heads
    assert b"client-secret" not in head and b"client-bearer" not in head
    assert b"x-api-key" not in head.lower()
    assert b"authorization: Bearer engine-key" in head


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=["chat", "messages", "models"])
def test_headers_named_by_any_connection_header_are_not_forwarded(
    proxy_server: ProxyFactory,
    canned_engine: EngineFactory,
    method: str,
    path: str,
    body: bytes,
) -> None:
    engine = canned_engine(ANSWER)
    base = proxy_server(upstream_url=engine.url)
    lines = [b"connection: x-first", b"connection: x-second", b"x-first: 1", b"x-second: 2"]
    raw_request(base, method, path, [*lines, b"x-kept: yes"], body)
    (head,) = engine.heads
    lower = head.lower()
    assert b"x-first" not in lower and b"x-second" not in lower
    assert b"x-kept: yes" in lower


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=["chat", "messages", "models"])
@pytest.mark.parametrize("name", [b"authorization: Bearer ", b"x-api-key: "])
def test_a_repeated_credential_is_refused_before_the_engine(
    proxy_server: ProxyFactory,
    canned_engine: EngineFactory,
    method: str,
    path: str,
    body: bytes,
    name: bytes,
) -> None:
    """The proxy checks one credential: it must not let another one through with it."""
    engine = canned_engine(ANSWER)
    base = proxy_server(upstream_url=engine.url, api_keys=["good"])
    answer = raw_request(base, method, path, [name + b"good", name + b"evil"], body)
    assert status_of(answer) == 400
    assert b"more than one API key header" in answer
    assert engine.heads == []


def test_without_a_proxy_key_every_credential_line_is_forwarded_as_sent(
    proxy_server: ProxyFactory, canned_engine: EngineFactory
) -> None:
    """No key checked and none of its own: the engine sees what the client sent, all of it
    (not the last of two, as a dict would have it)."""
    engine = canned_engine(ANSWER)
    base = proxy_server(upstream_url=engine.url)
    lines = [b"authorization: Bearer one", b"authorization: Bearer two"]
    raw_request(base, "POST", "/v1/chat/completions", lines, CHAT)
    (head,) = engine.heads
    assert b"Bearer one" in head and b"Bearer two" in head


def test_pass_through_asks_the_engine_for_no_encoding_the_client_did_not(
    proxy_server: ProxyFactory, canned_engine: EngineFactory
) -> None:
    engine = canned_engine(ANSWER)
    base = proxy_server(upstream_url=engine.url)
    raw_request(base, "GET", "/v1/models", [], b"")
    raw_request(base, "GET", "/v1/models", [b"accept-encoding: gzip"], b"")
    first, second = (h.lower() for h in engine.heads)
    assert b"gzip" not in first and b"br" not in first.split(b"accept-encoding:")[-1][:20]
    assert b"accept-encoding: identity" in first
    assert b"accept-encoding: gzip" in second


@pytest.mark.parametrize(
    ("configured", "named"),
    [("127.0.0.1", "localhost"), ("localhost", "127.0.0.1"), ("127.0.0.1", "[::1]")],
)
def test_a_location_naming_the_engine_by_another_loopback_name_is_made_relative(
    proxy_server: ProxyFactory, canned_engine: EngineFactory, configured: str, named: str
) -> None:
    engine = canned_engine(b"")
    engine.response = (
        b"HTTP/1.1 307 Temporary Redirect\r\nlocation: http://%s:%d/v1/other?x=1\r\n"
        b"content-length: 0\r\n\r\n" % (named.encode(), engine.port)
    )
    base = proxy_server(upstream_url=f"http://{configured}:{engine.port}")
    resp = httpx.get(base + "/v1/somewhere")
    assert resp.status_code == 307
    assert resp.headers["location"] == "/v1/other?x=1"
