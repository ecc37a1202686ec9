"""The proxy's own errors on ``/v1/messages`` in Anthropic's envelope, driven by the official
``anthropic`` SDK over real sockets: each one raises the SDK's exception class for its status,
with Anthropic's error type and the proxy's message. The OpenAI routes keep OpenAI's envelope."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import pytest

from proxy.errors import (
    ANTHROPIC_TYPES,
    BadRequest,
    DeadlineExceeded,
    Forbidden,
    GuardError,
    PayloadTooLarge,
    Unauthorized,
    UpstreamError,
    UpstreamTimeout,
    anthropic_error_object,
)
from proxy.server.paths import error_format
from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD

ProxyFactory = Callable[..., str]
USER: Any = [{"role": "user", "content": "Tell me something about Paris, please."}]
TEXT = "The capital of France is Paris, a city on the Seine with many old bridges. " * 20


@pytest.fixture
def clients() -> Iterator[Callable[..., anthropic.Anthropic]]:
    made: list[anthropic.Anthropic] = []

    def make(base: str, **kwargs: Any) -> anthropic.Anthropic:
        if "auth_token" not in kwargs:
            kwargs.setdefault("api_key", "k")
        client = anthropic.Anthropic(base_url=base, max_retries=0, timeout=HANG_GUARD, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _assert_anthropic(error: anthropic.APIStatusError, kind: str, message: str) -> None:
    assert error.type == kind
    assert error.api_message is not None and message in error.api_message
    body = error.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}


# ---------------------------------------------------------------- pure parts
@pytest.mark.parametrize(
    ("path", "fmt"),
    [
        ("/v1/messages", "anthropic"),
        ("/v1/messages/count_tokens", "anthropic"),
        ("/v1/messagesx", "openai"),
        ("/v1/chat/completions", "openai"),
        ("/v1/responses", "openai"),
        ("/", "openai"),
    ],
)
def test_error_format_by_route(path: str, fmt: str) -> None:
    assert error_format(path) == fmt


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (BadRequest("x"), "invalid_request_error"),
        (Unauthorized("x"), "authentication_error"),
        (Forbidden("x"), "permission_error"),
        (PayloadTooLarge("x"), "request_too_large"),
        (UpstreamError("x"), "api_error"),
        (UpstreamTimeout("x"), "timeout_error"),
        (DeadlineExceeded("x"), "timeout_error"),
        (GuardError("x"), "api_error"),
    ],
)
def test_every_error_has_a_documented_anthropic_type(error: GuardError, kind: str) -> None:
    assert error.to_anthropic("rid") == {
        "type": "error",
        "error": {"type": kind, "message": "x"},
        "request_id": "rid",
    }
    assert kind in ANTHROPIC_TYPES


@pytest.mark.parametrize(
    ("recorded", "expected"),
    [
        ({"type": "overloaded_error", "message": "busy"}, ("overloaded_error", "busy")),
        (UpstreamTimeout("slow").to_dict()["error"], ("timeout_error", "slow")),
        (UpstreamError("gone").to_dict()["error"], ("api_error", "gone")),
        ({"type": "BadRequestError", "message": 3}, ("api_error", "3")),
        ({}, ("api_error", "")),
    ],
)
def test_a_recorded_error_object_becomes_anthropics(
    recorded: dict[str, Any], expected: tuple[str, str]
) -> None:
    """The engine's own Anthropic error keeps its type; the proxy's OpenAI-shaped record is
    translated; anything else is an ``api_error`` with a text message."""
    kind, message = expected
    assert anthropic_error_object(recorded) == {"type": kind, "message": message}


# ---------------------------------------------------------------- before the stream
def test_bad_body_is_a_bad_request_error(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, clients: Callable[..., anthropic.Anthropic]
) -> None:
    base = proxy_server()
    with pytest.raises(anthropic.BadRequestError) as info:
        clients(base).messages.create(model="m", messages=[], max_tokens=10)
    _assert_anthropic(info.value, "invalid_request_error", "'messages' must be a non-empty array")
    r = httpx.post(base + "/v1/messages", content=b"{not json", headers={"x-request-id": "req-1"})
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["request_id"] == "req-1"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("The request body is not valid JSON")
    assert fake_upstream.guarded_requests() == []


def test_missing_or_wrong_key_is_an_authentication_error(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, clients: Callable[..., anthropic.Anthropic]
) -> None:
    base = proxy_server(api_keys=["sk-right"])
    for client in (clients(base, auth_token="sk-wrong"), clients(base)):
        with pytest.raises(anthropic.AuthenticationError) as info:
            client.messages.create(model="m", messages=USER, max_tokens=10)
        _assert_anthropic(info.value, "authentication_error", "Invalid or missing API key.")
    with pytest.raises(anthropic.AuthenticationError):
        clients(base).messages.count_tokens(model="m", messages=USER)
    fake_upstream.script = Script(texts=["Fine."])
    for ok in (clients(base, auth_token="sk-right"), clients(base, api_key="sk-right")):
        assert ok.messages.create(model="m", messages=USER, max_tokens=10).content
    # Anthropic's documented header (its API reference, older SDKs, curl) is a key too; a
    # bearer token, when there is one, is the key.
    body = {"model": "m", "messages": USER, "max_tokens": 10}
    r = httpx.post(base + "/v1/messages", json=body, headers={"x-api-key": "sk-right"})
    assert r.status_code == 200 and r.json()["type"] == "message"
    both = {"authorization": "Bearer sk-wrong", "x-api-key": "sk-right"}
    r = httpx.post(base + "/v1/messages", json=body, headers=both)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    # The OpenAI routes keep OpenAI's envelope.
    r = httpx.post(base + "/v1/chat/completions", json={})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_override_from_a_key_not_allowed_is_a_permission_error(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, clients: Callable[..., anthropic.Anthropic]
) -> None:
    base = proxy_server(
        api_keys=["sk-user"], override_api_keys=["sk-ops"], allow_client_override=True
    )
    client = clients(base, auth_token="sk-user")
    with pytest.raises(anthropic.PermissionDeniedError) as info:
        client.messages.create(
            model="m", messages=USER, max_tokens=10, extra_headers={"x-guard-mode": "off"}
        )
    _assert_anthropic(info.value, "permission_error", "may not set 'x-guard-mode'")


def test_body_over_the_limit_is_request_too_large(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, clients: Callable[..., anthropic.Anthropic]
) -> None:
    base = proxy_server(max_body_bytes=200)
    big: Any = [{"role": "user", "content": "x" * 1000}]
    with pytest.raises(anthropic.RequestTooLargeError) as info:
        clients(base).messages.create(model="m", messages=big, max_tokens=10)
    _assert_anthropic(info.value, "request_too_large", "limit of 200 bytes")
    assert fake_upstream.guarded_requests() == []


def test_unreachable_engine_is_an_api_error_on_messages_and_count_tokens(
    proxy_server: ProxyFactory, clients: Callable[..., anthropic.Anthropic]
) -> None:
    client = clients(proxy_server(upstream_url=f"http://127.0.0.1:{_closed_port()}"))
    with pytest.raises(anthropic.InternalServerError) as info:
        client.messages.create(model="m", messages=USER, max_tokens=10)
    assert info.value.status_code == 502
    _assert_anthropic(info.value, "api_error", "")
    with pytest.raises(anthropic.InternalServerError) as relayed:
        client.messages.count_tokens(model="m", messages=USER)
    assert relayed.value.status_code == 502
    assert relayed.value.type == "api_error"


def test_engine_that_does_not_answer_in_time_is_a_timeout_error(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, clients: Callable[..., anthropic.Anthropic]
) -> None:
    fake_upstream.script = Script(hang=True)
    client = clients(proxy_server(read_timeout=0.3))
    with pytest.raises(anthropic.GatewayTimeoutError) as info:
        client.messages.create(model="m", messages=USER, max_tokens=10)
    assert info.value.type == "timeout_error"


def test_deadline_before_the_answer_is_a_timeout_error(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, clients: Callable[..., anthropic.Anthropic]
) -> None:
    fake_upstream.script = Script(hang=True)
    client = clients(proxy_server(request_deadline=0.3))
    with pytest.raises(anthropic.GatewayTimeoutError) as info:
        client.messages.create(model="m", messages=USER, max_tokens=10)
    _assert_anthropic(info.value, "timeout_error", "ran past this deployment's time limit")


# ---------------------------------------------------------------- after the 200
@pytest.mark.parametrize("mode", ["enforce", "off"])
def test_deadline_mid_stream_is_an_error_event(
    fake_upstream: FakeVLLM,
    proxy_server: ProxyFactory,
    clients: Callable[..., anthropic.Anthropic],
    mode: str,
) -> None:
    """Guarded or relayed as it is (``off``), a stream cut by the deadline ends with
    ``event: error`` in Anthropic's envelope, which the SDK raises with its type."""
    fake_upstream.script = Script(texts=[TEXT], chunk_delay=0.02)
    client = clients(proxy_server(request_deadline=0.5, mode=mode))
    seen: list[str] = []
    with (
        pytest.raises(anthropic.APIStatusError) as info,
        client.messages.stream(model="m", messages=USER, max_tokens=4000) as stream,
    ):
        for event in stream:
            seen.append(event.type)
    assert "content_block_delta" in seen
    _assert_anthropic(info.value, "timeout_error", "ran past this deployment's time limit")


def test_engine_gone_mid_stream_is_an_api_error_event(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, clients: Callable[..., anthropic.Anthropic]
) -> None:
    fake_upstream.script = Script(texts=[TEXT], die_after=3)
    client = clients(proxy_server())
    with (
        pytest.raises(anthropic.APIStatusError) as info,
        client.messages.stream(model="m", messages=USER, max_tokens=4000) as stream,
    ):
        for _ in stream:
            pass
    _assert_anthropic(info.value, "api_error", "")


def test_engine_gone_mid_stream_for_a_non_streaming_client(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, clients: Callable[..., anthropic.Anthropic]
) -> None:
    """The answer was being collected: the client gets an error answer in Anthropic's
    envelope, not OpenAI's."""
    fake_upstream.script = Script(texts=[TEXT], die_after=3)
    with pytest.raises(anthropic.InternalServerError) as info:
        clients(proxy_server()).messages.create(model="m", messages=USER, max_tokens=4000)
    assert info.value.status_code == 502
    _assert_anthropic(info.value, "api_error", "")
    assert isinstance(info.value.body, dict) and info.value.body.get("request_id")
