"""Property-based fuzzing of the proxy's HTTP layer: odd requests over raw sockets.

Hypothesis builds requests a careless or hostile client could send — every spelling of the
guarded routes, ``Expect: 100-continue``, chunked request bodies, duplicate and odd headers,
bodies that are not JSON or whose fields have the wrong types — and sends each over a raw socket
to the real proxy (uvicorn + httptools) in front of the fake engine. Whatever the input, the
answer must be one well-formed HTTP/1.1 response that arrives in bounded time, is never a 500,
speaks the OpenAI error format when it is an error of the proxy's own, and leaves no
generation running upstream.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import httptools
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import FakeVLLM, Script
from tests.net import HANG_GUARD

GUARDED_SPELLINGS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/chat/completions/",
    "//v1/chat/completions",
    "/v1//chat/completions",
    "/v1/chat/./completions",
    "/v1/x/../chat/completions",
    "/v1/chat%2Fcompletions",
    "/v1/chat%2fcompletions",
    "/v1/%63hat/completions",
    "/v1/completions/",
    "/v1/completions?x=1",
]
OTHER_PATHS = ["/v1/models", "/health", "/version", "/tokenize", "/nope", "/v1/../../etc/passwd"]

_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False),
    st.text(max_size=20),
)  # fmt: skip
_json = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def chat_like_body(draw: st.DrawFn) -> bytes:
    """A JSON body close enough to a real request that it reaches deep code paths."""
    body: dict[str, Any] = {}
    if draw(st.booleans()):
        body["model"] = draw(st.one_of(st.just("fake-model"), _json))
    if draw(st.booleans()):
        body["messages"] = draw(
            st.one_of(
                st.just([{"role": "user", "content": "Say hello."}]),
                st.lists(
                    st.dictionaries(
                        st.sampled_from(["role", "content", "name"]), _json, max_size=3
                    ),
                    max_size=3,
                ),
                _json,
            )
        )
    if draw(st.booleans()):
        body["prompt"] = draw(st.one_of(st.just("Say hello."), _json))
    if draw(st.integers(0, 3)) == 0:
        # Small: the fake engine really generates every choice it is asked for.
        body["n"] = draw(st.one_of(st.integers(-2, 4), st.booleans(), st.text(max_size=3)))
    for key in ("stream", "max_tokens", "max_completion_tokens", "stream_options",
                "temperature", "response_format", "logprobs"):  # fmt: skip
        if draw(st.integers(0, 3)) == 0:
            body[key] = draw(
                st.one_of(
                    st.booleans(), st.integers(-5, 10**7), _json, st.just({"include_usage": True})
                )
            )
    raw = json.dumps(body).encode()
    mangle = draw(st.integers(0, 9))
    if mangle == 0:
        return draw(st.binary(max_size=64))
    if mangle == 1:
        return raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    return raw


@st.composite
def request_bytes(draw: st.DrawFn) -> tuple[bytes, str]:
    path = draw(st.sampled_from(GUARDED_SPELLINGS + OTHER_PATHS))
    method = draw(st.sampled_from(["POST", "POST", "POST", "GET", "PUT"]))
    body = draw(chat_like_body()) if method != "GET" else b""
    headers: list[tuple[str, str]] = [("Host", "proxy.test"), ("Connection", "close")]
    if draw(st.booleans()):
        headers.append(("Content-Type", draw(st.sampled_from(["application/json", "text/plain"]))))
    if draw(st.integers(0, 2)) == 0:
        headers.append(("Expect", "100-continue"))
    if draw(st.integers(0, 4)) == 0:
        headers.append(("x-guard-mode", draw(st.sampled_from(["enforce", "monitor", "off", "??"]))))
    if draw(st.integers(0, 4)) == 0:
        headers.append(
            (
                "x-request-id",
                draw(st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=40)),
            )
        )
    if draw(st.integers(0, 4)) == 0:
        headers.append(
            (
                "Authorization",
                "Bearer "
                + draw(st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=10)),
            )
        )
    if draw(st.integers(0, 4)) == 0:
        headers.append(("Accept-Encoding", draw(st.sampled_from(["gzip", "br", "identity", "*"]))))
    chunked = method != "GET" and draw(st.integers(0, 3)) == 0
    if chunked:
        headers.append(("Transfer-Encoding", "chunked"))
        cut = draw(st.integers(0, len(body)))
        parts = [p for p in (body[:cut], body[cut:]) if p]
        payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    else:
        headers.append(("Content-Length", str(len(body))))
        payload = body
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
    return head.encode("latin-1") + b"\r\n" + payload, path


class _Response:
    def __init__(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.complete = False
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        if self.status >= 200:
            self.complete = True
        else:  # an interim (1xx) response: the final one follows on the same connection
            self.headers.clear()
            self.body.clear()


def _exchange(port: int, data: bytes, timeout: float = HANG_GUARD) -> _Response:
    """Send ``data``, read the final (non-1xx) response to its end."""
    resp = _Response()
    deadline = time.monotonic() + timeout
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        while not resp.complete:
            remaining = deadline - time.monotonic()
            assert remaining > 0, "no complete response in time (hung connection)"
            sock.settimeout(remaining)
            chunk = sock.recv(65536)
            if not chunk:
                break
            resp.parser.feed_data(chunk)
    return resp


@pytest.fixture
def fuzz_proxy(fake_upstream: FakeVLLM, proxy_server: Callable[..., str]) -> tuple[int, FakeVLLM]:
    fake_upstream.script = Script(texts=["Hello there, this is a healthy reply."])
    url = proxy_server(allow_client_override=True, max_body_bytes=64 * 1024)
    return int(url.rsplit(":", 1)[1]), fake_upstream


@settings(
    max_examples=int(os.environ.get("GUARD_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(req=request_bytes())
def test_any_request_gets_one_well_formed_answer_and_leaks_nothing(
    fuzz_proxy: tuple[int, FakeVLLM], req: tuple[bytes, str]
) -> None:
    """Whatever the request, one complete HTTP response, never a 500, errors in the OpenAI
    envelope, and every upstream generation it started is over when the answer is."""
    port, fake = fuzz_proxy
    data, path = req
    before = len(fake.client_requests)
    resp = _exchange(port, data)
    location = dict(resp.headers).get(b"location", b"")
    assert f":{fake.port}".encode() not in location, "the engine's address reached the client"
    assert resp.complete, f"incomplete response (status {resp.status})"
    assert 200 <= resp.status < 600
    assert resp.status != 500, bytes(resp.body[:300])
    ctype = dict(resp.headers).get(b"content-type", b"")
    if resp.status >= 400 and ctype.startswith(b"application/json"):
        payload = json.loads(bytes(resp.body))
        if "error" in payload:
            assert isinstance(payload["error"].get("message"), str)
    if resp.status == 200 and ctype.startswith(b"text/event-stream"):
        assert bytes(resp.body).endswith(b"data: [DONE]\n\n")
    started = fake.client_requests[before:]
    if path in GUARDED_SPELLINGS and data.startswith(b"POST"):
        # Every spelling of a guarded route is guarded: what reaches the engine is the canonical
        # route with the proxy's rewriting applied (a max_tokens limit is always set).
        for rec in started:
            assert rec.path.split("?")[0] in ("/v1/chat/completions", "/v1/completions"), rec.path
            assert isinstance(rec.json, dict), rec.body[:100]
            assert "max_tokens" in rec.json or "max_completion_tokens" in rec.json
    assert fake.wait_for(lambda: all(r.finished is not None for r in started)), (
        "an upstream request is still running after the client got its answer"
    )
