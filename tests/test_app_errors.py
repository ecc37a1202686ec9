"""Every error the proxy can answer with is OpenAI-shaped JSON with the right status."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD

ProxyFactory = Callable[..., str]
CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]


def assert_openai_error(resp: httpx.Response, status: int, param: str | None = None) -> None:
    assert resp.status_code == status
    assert resp.headers["content-type"] == "application/json"
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    assert err["param"] == param


def test_malformed_json_is_400(fake_upstream: FakeVLLM, proxy_server: ProxyFactory) -> None:
    r = httpx.post(proxy_server() + CHAT, content=b'{"model": "m", "messages": [', headers={})
    assert_openai_error(r, 400)
    assert "JSON" in r.json()["error"]["message"]
    assert fake_upstream.guarded_requests() == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "messages": "hi"}, "messages"),
        ({"model": 3, "messages": MESSAGES}, "model"),
        ({"model": "m", "messages": MESSAGES, "max_tokens": "many"}, "max_tokens"),
        ({"model": "m", "messages": MESSAGES, "stream": "yes"}, "stream"),
        ({"model": "m", "messages": MESSAGES, "n": 0}, "n"),
        (
            {"model": "m", "messages": MESSAGES, "stream_options": {"include_usage": True}},
            "stream_options",
        ),
        ([1, 2], None),
    ],
)
def test_wrong_field_types_are_400_naming_the_field(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, body: Any, param: str | None
) -> None:
    r = httpx.post(proxy_server() + CHAT, json=body)
    assert_openai_error(r, 400, param)
    assert fake_upstream.guarded_requests() == []


def test_completions_prompt_is_checked(fake_upstream: FakeVLLM, proxy_server: ProxyFactory) -> None:
    r = httpx.post(proxy_server() + "/v1/completions", json={"model": "m", "prompt": {"x": 1}})
    assert_openai_error(r, 400, "prompt")


@pytest.mark.parametrize("path", [CHAT, "/v1/embeddings"])
def test_body_over_the_limit_is_413(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, path: str
) -> None:
    base = proxy_server(max_body_bytes=1000)
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 2000}]}
    r = httpx.post(base + path, json=body)
    assert_openai_error(r, 413)
    assert fake_upstream.requests == []


def test_body_over_the_limit_without_content_length_is_413(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server(max_body_bytes=1000)

    def chunks() -> Any:
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        for _ in range(20):
            yield b"x" * 100
        yield b'"}]}'

    r = httpx.post(base + CHAT, content=chunks())
    assert_openai_error(r, 413)


def test_api_keys_protect_the_proxy(fake_upstream: FakeVLLM, proxy_server: ProxyFactory) -> None:
    base = proxy_server(api_keys=["k-one", "k-two"])
    body = {"model": "m", "messages": MESSAGES}
    r = httpx.post(base + CHAT, json=body)
    assert_openai_error(r, 401)
    assert r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(base + CHAT, json=body, headers={"authorization": "Bearer wrong"})
    assert_openai_error(r, 401)
    r = httpx.get(base + "/v1/models")
    assert_openai_error(r, 401)
    assert fake_upstream.requests == []
    client = openai.OpenAI(base_url=base + "/v1", api_key="k-two", max_retries=0)
    assert client.chat.completions.create(model="m", messages=MESSAGES).choices  # type: ignore[arg-type]
    assert fake_upstream.last.headers["authorization"] == "Bearer k-two"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base + "/v1", api_key="nope", max_retries=0).models.list()
    assert httpx.get(base + "/health").status_code == 200


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("stream", [True, False])
def test_upstream_unreachable_is_502(proxy_server: ProxyFactory, stream: bool) -> None:
    base = proxy_server(upstream_url=f"http://127.0.0.1:{_dead_port()}")
    r = httpx.post(base + CHAT, json={"model": "m", "messages": MESSAGES, "stream": stream})
    assert_openai_error(r, 502)
    assert_openai_error(httpx.get(base + "/v1/models"), 502)
    assert httpx.get(base + "/ready").status_code == 503


def test_upstream_timeout_is_504(fake_upstream: FakeVLLM, proxy_server: ProxyFactory) -> None:
    fake_upstream.script = Script(hang=True)
    base = proxy_server(read_timeout=0.3)
    r = httpx.post(base + CHAT, json={"model": "m", "messages": MESSAGES, "stream": True})
    assert_openai_error(r, 504)


@pytest.mark.parametrize("status", [400, 404, 422, 500, 503])
@pytest.mark.parametrize("stream", [True, False])
def test_upstream_error_statuses_are_relayed_as_sent(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, status: int, stream: bool
) -> None:
    error = orjson.dumps({"object": "error", "message": f"upstream says {status}", "code": status})
    fake_upstream.script = Script(status=status, error_body=error)
    r = httpx.post(
        proxy_server() + CHAT, json={"model": "m", "messages": MESSAGES, "stream": stream}
    )
    assert r.status_code == status
    assert r.content == error
    assert len(fake_upstream.guarded_requests()) == 1  # no retry for errors about other things


@pytest.mark.parametrize("stream", [True, False])
def test_upstream_dying_mid_stream(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, stream: bool
) -> None:
    """Streaming: an SSE error event then [DONE], never a hang. Non-streaming: a 502."""
    fake_upstream.script = Script(texts=["one two three four five six seven"], die_after=3)
    r = httpx.post(
        proxy_server() + CHAT,
        json={"model": "m", "messages": MESSAGES, "stream": stream},
        timeout=HANG_GUARD,
    )
    if stream:
        assert r.status_code == 200
        blocks = r.content.split(b"\n\n")
        assert blocks[-1] == b"" and blocks[-2] == b"data: [DONE]"
        error = orjson.loads(blocks[-3][6:])["error"]
        assert error["code"] == "upstream_disconnected" and error["message"]
    else:
        assert_openai_error(r, 502)


def test_upstream_error_event_mid_stream_is_relayed(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    fake_upstream.script = Script(texts=["one two three four five"], mid_stream_error=2)
    base = proxy_server()
    r = httpx.post(base + CHAT, json={"model": "m", "messages": MESSAGES, "stream": True})
    assert b'"error":{"message":"engine failure"' in r.content
    assert r.content.endswith(b"data: [DONE]\n\n")
    r = httpx.post(base + CHAT, json={"model": "m", "messages": MESSAGES})
    assert r.status_code == 500 and r.json()["error"]["message"] == "engine failure"


def test_engine_rejecting_stream_options_falls_back_and_remembers(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    fake_upstream.script = Script(texts=["Hello world."], reject_stream_options=True)
    base = proxy_server()
    client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    resp = client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert resp.choices[0].message.content == "Hello world."
    first, retry = fake_upstream.guarded_requests()
    assert "stream_options" in first.json and "stream_options" not in retry.json
    chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))  # type: ignore[arg-type]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello world."
    # Remembered: the third request went out without the options at once.
    assert len(fake_upstream.guarded_requests()) == 3
    assert "stream_options" not in fake_upstream.last.json
