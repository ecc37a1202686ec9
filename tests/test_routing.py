"""Routing that cannot be sidestepped: every spelling of a guarded route is guarded, the engine
receives the canonical path, and the engine's own address never reaches the client."""

from __future__ import annotations

import http.client
import string
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.server.paths import (
    GUARDED,
    UNGUARDED_GENERATING,
    PathError,
    canonical_path,
    relative_location,
    wire_path,
)
from tests.conftest import CannedEngine
from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD

ProxyFactory = Callable[..., str]
MESSAGES = [{"role": "user", "content": "hi"}]

# ---------------------------------------------------------------------------- pure: spellings


@st.composite
def spellings(draw: st.DrawFn, path: str) -> bytes:
    """One way of writing ``path`` that the engine's router (decoded path, redirected trailing
    slash) would still take for it: percent-encoded characters in either hex case (``/`` too),
    doubled slashes, ``.`` segments, ``name/..`` detours, a trailing slash."""
    out: list[str] = []
    for segment in path.strip("/").split("/"):
        for _ in range(draw(st.integers(0, 2))):
            out.append(draw(st.sampled_from([".", "", "x/..", "a%2Fb/../..", "%2E"])))
        chars = []
        for ch in segment:
            if draw(st.booleans()):
                hexed = f"{ord(ch):02X}"
                chars.append("%" + (hexed.lower() if draw(st.booleans()) else hexed))
            else:
                chars.append(ch)
        out.append("".join(chars))
    sep = draw(st.sampled_from(["/", "//", "%2F", "%2f", "/./"]))
    text = "/" + sep.join(out)
    if draw(st.booleans()):
        text += draw(st.sampled_from(["/", "//", "/.", "/%2F"]))
    return text.encode()


ROUTES = [*GUARDED, *UNGUARDED_GENERATING, "/v1/models", "/metrics"]


@pytest.mark.parametrize("route", ROUTES)
@given(data=st.data())
def test_every_spelling_maps_to_the_canonical_route(route: str, data: st.DataObject) -> None:
    """Whatever spelling a client uses, the proxy routes (and forwards) the canonical path."""
    raw = data.draw(spellings(route))
    assert canonical_path(raw) == route


@given(st.text(alphabet=string.ascii_letters + string.digits + "/.%-_~", max_size=40))
def test_canonical_paths_are_fixed_points(text: str) -> None:
    """Normalising twice changes nothing more, and the result has no empty, ``.`` or ``..``
    segment and no trailing slash (or the path is refused)."""
    try:
        once = canonical_path(("/" + text).encode())
    except PathError:
        return
    assert canonical_path(wire_path(once).encode()) == once
    assert once == "/" or not once.endswith("/")
    assert all(seg not in ("", ".", "..") for seg in once.split("/")[1:]) or once == "/"


@pytest.mark.parametrize(
    "raw", [b"/..", b"/../v1/models", b"/v1/../../x", b"/v1/%2E%2E/%2e%2e/x", b"/%2e%2e%2Fa"]
)
def test_a_path_above_the_root_is_refused(raw: bytes) -> None:
    with pytest.raises(PathError):
        canonical_path(raw)


def test_decoded_characters_are_encoded_again_on_the_wire() -> None:
    """A decoded ``%3F`` must not become a query separator toward the engine."""
    assert wire_path(canonical_path(b"/v1/a%3Fb%20c")) == "/v1/a%3Fb%20c"
    assert wire_path("/v1/chat/completions") == "/v1/chat/completions"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"http://127.0.0.1:8000/v1/chat/completions", b"/v1/chat/completions"),
        (b"HTTP://127.0.0.1:8000/v1/x?y=1", b"/v1/x?y=1"),
        (b"//127.0.0.1:8000/a", b"/a"),
        (b"http://127.0.0.1:8000", b"/"),
        (b"/already/relative", b"/already/relative"),
        (b"https://elsewhere.example/a", b"https://elsewhere.example/a"),
        (b"http://127.0.0.1:9999/a", b"http://127.0.0.1:9999/a"),
    ],
)
def test_location_naming_the_engine_becomes_relative(value: bytes, expected: bytes) -> None:
    assert relative_location(value, "http://127.0.0.1:8000") == expected


def test_default_ports_are_the_same_origin() -> None:
    assert relative_location(b"http://engine:80/a", "http://engine") == b"/a"
    assert relative_location(b"https://engine/a", "https://engine:443") == b"/a"


# ---------------------------------------------------------------------------- through the proxy


def _raw_request(
    base: str, method: str, target: str, body: bytes = b""
) -> http.client.HTTPResponse:
    """A request with the target exactly as written (httpx would normalise it first)."""
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=HANG_GUARD)
    conn.putrequest(method, target, skip_accept_encoding=True)
    conn.putheader("content-type", "application/json")
    conn.putheader("content-length", str(len(body)))
    conn.endheaders(body)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp


@pytest.mark.parametrize(
    "target",
    [
        "/v1/chat/completions/",
        "//v1/chat/completions",
        "/v1%2Fchat%2Fcompletions",
        "/v1/chat%2fcompletions/",
        "/v1/./chat/x/../completions",
        "/v1/chat/%63ompletions",
    ],
)
def test_spellings_of_a_guarded_route_are_guarded(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, target: str
) -> None:
    """The guard's response header and its max_tokens default prove the request was guarded;
    the engine saw the canonical path."""
    base = proxy_server(max_tokens_default=77)
    body = orjson.dumps({"model": "m", "messages": MESSAGES})
    resp = _raw_request(base, "POST", target, body)
    assert resp.status == 200
    assert resp.getheader("x-guard-max-tokens") == "defaulted; value=77"
    rec = fake_upstream.last
    assert rec.path == "/v1/chat/completions"
    assert rec.json["max_tokens"] == 77 and rec.json["stream"] is True


def test_pass_through_forwards_the_canonical_path(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server()
    resp = _raw_request(base, "POST", "//tokenize/?x=%2F", b'{"prompt":"a"}')
    assert resp.status == 200
    assert fake_upstream.last.path == "/tokenize?x=%2F"


def test_a_path_above_the_root_gets_400(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server()
    resp = _raw_request(base, "GET", "/v1/../../etc/passwd")
    assert resp.status == 400
    assert resp.getheader("x-request-id")
    assert fake_upstream.requests == []


def test_engine_redirect_does_not_leak_its_address(
    canned_engine: Callable[[bytes], CannedEngine], proxy_server: ProxyFactory
) -> None:
    """A pass-through 307 whose Location names the engine reaches the client relative."""
    engine = canned_engine(b"")
    engine.response = (
        b"HTTP/1.1 307 Temporary Redirect\r\ncontent-length: 0\r\nconnection: close\r\n"
        b"location: " + engine.url.encode() + b"/v1/models\r\n"
        b"content-location: " + engine.url.encode() + b"/v1/x?y=1\r\n\r\n"
    )
    base = proxy_server(upstream_url=engine.url)
    r = httpx.get(base + "/v1/models/")
    assert r.status_code == 307
    assert r.headers["location"] == "/v1/models"
    assert r.headers["content-location"] == "/v1/x?y=1"
    assert str(engine.port) not in str(r.headers)


def test_guarded_route_relays_an_engine_error_without_its_address(
    canned_engine: Callable[[bytes], CannedEngine], proxy_server: ProxyFactory
) -> None:
    engine = canned_engine(b"")
    engine.response = (
        b"HTTP/1.1 307 Temporary Redirect\r\ncontent-length: 0\r\nconnection: close\r\n"
        b"location: " + engine.url.encode() + b"/v1/chat/completions\r\n\r\n"
    )
    base = proxy_server(upstream_url=engine.url)
    r = httpx.post(base + "/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert r.status_code == 307
    assert r.headers["location"] == "/v1/chat/completions"


@pytest.mark.parametrize("stream", [True, False])
def test_a_200_that_is_not_a_stream_is_a_502(
    canned_engine: Callable[[bytes], CannedEngine], proxy_server: ProxyFactory, stream: bool
) -> None:
    """The proxy asked for a stream; a JSON 200 (a gateway's page, an engine that ignores
    ``stream``) is answered at once with 502, not buffered to its end."""
    engine = canned_engine(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000000\r\n"
        b'connection: close\r\n\r\n{"object":"chat.completion"'
    )
    base = proxy_server(upstream_url=engine.url)
    body = {"model": "m", "messages": MESSAGES, "stream": stream}
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=HANG_GUARD)
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_not_streaming"


def test_unguarded_routes_are_refused_with_reject(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server(unguarded_routes="reject")
    for path in (
        "/inference/v1/generate",
        "/inference/v1/generate/",
        "//v1/audio/transcriptions",
        "/invocations",
    ):
        r = httpx.post(base + path, json={"model": "m", "input": "x"})
        assert r.status_code == 403, path
        assert r.json()["error"]["code"] == "route_not_guarded"
        assert r.json()["error"]["type"] == "permission_error"
    assert fake_upstream.requests == []
    # Routes that generate nothing are still relayed.
    assert httpx.get(base + "/v1/models").status_code == 200


def test_unguarded_routes_pass(fake_upstream: FakeVLLM, proxy_server: ProxyFactory) -> None:
    """Relayed as they are (``serve`` warns of those the engine serves: test_serve.py)."""
    base = proxy_server()
    fake_upstream.script = Script(texts=["a b c"])
    with httpx.stream(
        "POST", base + "/inference/v1/generate", json={"model": "m", "input": "x"}
    ) as r:
        assert r.status_code == 200
        assert b"response.output_text.delta" in r.read()


def test_the_engines_request_id_header_is_not_repeated(
    canned_engine: Callable[[bytes], CannedEngine], proxy_server: ProxyFactory
) -> None:
    """An engine that echoes x-request-id (vLLM's middleware does) does not make the header
    appear twice: the client gets the proxy's, once."""
    engine = canned_engine(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
        b"x-request-id: engine-made\r\nconnection: close\r\n\r\n{}"
    )
    base = proxy_server(upstream_url=engine.url)
    r = httpx.get(base + "/v1/models", headers={"x-request-id": "mine"})
    assert r.headers.get_list("x-request-id") == ["mine"]
    assert b"x-request-id: mine" in engine.heads[-1].lower()
