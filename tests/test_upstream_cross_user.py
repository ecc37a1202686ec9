"""Regression: the cross-user leak through ``Expect: 100-continue``, through the whole proxy.

The bug: a client's ``Expect: 100-continue`` was forwarded to the engine; uvicorn (vLLM's
server) answered ``100 Continue`` first; the guarded routes' client took that as the whole
answer and pooled the connection while the real answer was still arriving, so the *next*
request on that connection — another user's — received the previous user's completion.

Here the real proxy (``create_app`` under uvicorn) sits in front of a real uvicorn engine that
reads the request body (so uvicorn sends ``100 Continue`` whenever it sees ``Expect``) and
echoes each request's own text. Two users alternate over many rounds, one always sending
``Expect: 100-continue``; each must get exactly its own answer, every time.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import httpx
import orjson
import pytest

from tests.net import HANG_GUARD
from tests.servers.engines import AiohttpEngine, UvicornEngine

ProxyFactory = Callable[..., str]
ROUNDS = 200


@pytest.fixture(scope="module")
def uvicorn_engine() -> Iterator[UvicornEngine]:
    with UvicornEngine() as engine:
        yield engine


def answer_text(resp: httpx.Response, stream: bool) -> str:
    assert resp.status_code == 200, resp.text
    if not stream:
        return str(resp.json()["choices"][0]["message"]["content"])
    text = []
    for line in resp.text.split("\n\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in orjson.loads(line[6:])["choices"]:
            text.append(choice["delta"].get("content", ""))
    return "".join(text)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("mode", ["enforce", "off"])
def test_alternating_users_each_get_exactly_their_own_answer(
    proxy_server: ProxyFactory, uvicorn_engine: UvicornEngine, mode: str, stream: bool
) -> None:
    base = proxy_server(upstream_url=uvicorn_engine.url, mode=mode)
    users = {
        "alice": httpx.Client(
            base_url=base, headers={"expect": "100-continue"}, timeout=HANG_GUARD
        ),
        "bob": httpx.Client(base_url=base, timeout=HANG_GUARD),
    }
    try:
        for n in range(ROUNDS):
            for who, http in users.items():
                text = f"{who} round {n} secret {uuid.uuid4().hex}"
                body = {
                    "model": "m",
                    "messages": [{"role": "user", "content": text}],
                    "stream": stream,
                    "max_tokens": 32,
                }
                resp = http.post("/v1/chat/completions", json=body)
                assert answer_text(resp, stream) == text, (mode, n, who)
    finally:
        for http in users.values():
            http.close()


def test_expect_is_never_forwarded_upstream_on_any_route(
    proxy_server: ProxyFactory, fake_upstream: object
) -> None:
    """``Expect``, ``TE``, hop-by-hop headers and those the client's ``Connection`` names stop
    at the proxy, on guarded routes and pass-through alike."""
    from tests.fakes.vllm import FakeVLLM

    assert isinstance(fake_upstream, FakeVLLM)
    base = proxy_server()
    headers = {
        "expect": "100-continue",
        "te": "trailers",
        "connection": "keep-alive, x-private",
        "x-private": "secret",
        "keep-alive": "timeout=HANG_GUARD",
        "x-kept": "yes",
    }
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(base + "/v1/chat/completions", json=body, headers=headers).status_code == 200
    httpx.post(base + "/v1/embeddings", json={"input": "x"}, headers=headers)
    assert len(fake_upstream.client_requests) == 2
    for rec in fake_upstream.client_requests:
        for name in ("expect", "te", "x-private", "keep-alive"):
            assert name not in rec.headers, (rec.path, name)
        assert rec.headers["x-kept"] == "yes"


def test_upstream_api_key_replaces_the_clients_authorization(
    proxy_server: ProxyFactory, fake_upstream: object
) -> None:
    from tests.fakes.vllm import FakeVLLM

    assert isinstance(fake_upstream, FakeVLLM)
    base = proxy_server(upstream_api_key="engine-key")
    auth = {"authorization": "Bearer client-key"}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(base + "/v1/chat/completions", json=body, headers=auth).status_code == 200
    httpx.get(base + "/v1/models", headers=auth)
    httpx.get(base + "/ready")
    assert len(fake_upstream.requests) >= 3
    for rec in fake_upstream.requests:
        assert rec.headers.get("authorization") == "Bearer engine-key", rec.path


def test_aiohttp_engine_through_the_proxy(proxy_server: ProxyFactory) -> None:
    """A second, independent server implementation (aiohttp.web: chunked framing of its own)
    behind the proxy, both users alternating, streamed and not."""
    with AiohttpEngine() as engine:
        base = proxy_server(upstream_url=engine.url)
        with httpx.Client(base_url=base, timeout=HANG_GUARD) as http:
            for n in range(50):
                for stream in (False, True):
                    text = f"round {n} {stream} {uuid.uuid4().hex}"
                    body = {
                        "model": "m",
                        "messages": [{"role": "user", "content": text}],
                        "stream": stream,
                    }
                    resp = http.post(
                        "/v1/chat/completions",
                        json=body,
                        headers={"expect": "100-continue"} if n % 2 else {},
                    )
                    assert answer_text(resp, stream) == text
