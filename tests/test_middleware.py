"""The middleware stack: the user's middleware sees every route, request ids, keys."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from proxy.observability import context
from proxy.server.app import create_app
from proxy.server.asgi import Message, Receive, Scope, Send
from proxy.settings import ConfigError, load_settings
from tests.conftest import ProxyServer
from tests.exposition_server import serve_exposition
from tests.fakes.vllm import FakeVLLM, Script

ProxyFactory = Callable[..., str]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class Tagging:
    """A user's pure-ASGI middleware: adds a header and records what it saw."""

    def __init__(self, app: Any, seen: list[tuple[str, str | None]]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.seen.append((scope["path"], context.request_id.get()))

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message["headers"], (b"x-user", b"1")]
            await send(message)

        await self.app(scope, receive, tagged)


@pytest.fixture
def user_app(fake_upstream: FakeVLLM) -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    settings = load_settings(upstream_url=fake_upstream.url, upstream_metrics_interval=0)
    app = create_app(settings)
    seen: list[tuple[str, str | None]] = []
    app.add_middleware(Tagging, seen=seen)
    server = ProxyServer(app).start()
    yield server.url, seen
    server.stop()


def test_user_middleware_wraps_guarded_pass_through_and_own_routes(
    fake_upstream: FakeVLLM, user_app: tuple[str, list[tuple[str, str | None]]]
) -> None:
    base, seen = user_app
    fake_upstream.script = Script(texts=["one two three four"])
    with httpx.stream(
        "POST", base + "/v1/chat/completions", json={**CHAT, "stream": True}
    ) as stream:
        assert stream.headers["x-user"] == "1"
        body = stream.read()
    assert body.endswith(b"data: [DONE]\n\n") and b" four" in body
    models = httpx.get(base + "/v1/models")
    assert models.headers["x-user"] == "1" and models.json()["data"][0]["id"] == "fake-model"
    assert httpx.get(base + "/health").headers["x-user"] == "1"
    # The middleware saw the canonical paths, and the request id was already set.
    assert [p for p, _ in seen] == ["/v1/chat/completions", "/v1/models", "/health"]
    assert all(rid is not None and re.fullmatch(r"[0-9a-f]{32}", rid) for _, rid in seen)


# ---------------------------------------------------------------------------- request id


def test_a_sane_request_id_is_kept_everywhere(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server(api_keys=["k"])
    rid = "abc.DEF:123-_x"
    auth = {"authorization": "Bearer k", "x-request-id": rid}
    fake_upstream.script = Script(texts=["a b"])
    # guarded stream, guarded non-stream, pass-through, own route, errors
    with httpx.stream(
        "POST", base + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=auth
    ) as r:
        assert r.headers["x-request-id"] == rid
        r.read()
    assert fake_upstream.last.headers["x-request-id"] == rid
    r2 = httpx.post(base + "/v1/chat/completions", json=CHAT, headers=auth)
    assert r2.status_code == 200 and r2.headers["x-request-id"] == rid
    r3 = httpx.get(base + "/v1/models", headers=auth)
    assert r3.headers["x-request-id"] == rid
    assert fake_upstream.last.headers["x-request-id"] == rid
    assert httpx.get(base + "/health", headers={"x-request-id": rid}).headers["x-request-id"] == rid
    unauth = httpx.get(base + "/v1/models", headers={"x-request-id": rid})
    assert unauth.status_code == 401 and unauth.headers["x-request-id"] == rid
    bad = httpx.post(base + "/v1/chat/completions", content=b"{", headers=auth)
    assert bad.status_code == 400 and bad.headers["x-request-id"] == rid


@pytest.mark.parametrize("sent", ["a" * 129, "has space", "semi;colon", "ünï", "", "a/b"], ids=repr)
def test_an_insane_request_id_is_replaced(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sent: str
) -> None:
    base = proxy_server()
    r = httpx.post(
        base + "/v1/chat/completions",
        json=CHAT,
        headers={"x-request-id": sent.encode("utf-8")},  # type: ignore[dict-item]
    )
    rid = r.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", rid)
    assert fake_upstream.last.headers["x-request-id"] == rid


def test_request_ids_differ_per_request(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server()
    ids = {httpx.get(base + "/health").headers["x-request-id"] for _ in range(5)}
    assert len(ids) == 5


# ---------------------------------------------------------------------------- keys


def test_upstream_api_key_replaces_the_clients(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server(api_keys=["client-key"], upstream_api_key="engine-key")
    auth = {"authorization": "Bearer client-key"}
    assert httpx.post(base + "/v1/chat/completions", json=CHAT, headers=auth).status_code == 200
    assert fake_upstream.last.headers["authorization"] == "Bearer engine-key"
    assert httpx.get(base + "/v1/models", headers=auth).status_code == 200
    assert fake_upstream.last.headers["authorization"] == "Bearer engine-key"
    # Without a client key at all, the engine still gets its own.
    base2 = proxy_server(upstream_api_key="engine-key")
    assert httpx.get(base2 + "/v1/models").status_code == 200
    assert fake_upstream.last.headers["authorization"] == "Bearer engine-key"


def test_without_upstream_key_the_clients_authorization_is_passed(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server()
    httpx.post(base + "/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer c"})
    assert fake_upstream.last.headers["authorization"] == "Bearer c"


def test_guard_mode_override_is_limited_to_override_keys(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """With GUARD_OVERRIDE_API_KEYS set, any other key sending x-guard-mode gets 403 (not a
    silent ignore: the client must not believe enforcement is off when it is not)."""
    base = proxy_server(api_keys=["plain"], override_api_keys=["admin"], allow_client_override=True)
    plain = {"authorization": "Bearer plain", "x-guard-mode": "off"}
    r = httpx.post(base + "/v1/chat/completions", json=CHAT, headers=plain)
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "override_not_allowed"
    assert fake_upstream.guarded_requests() == []
    # The plain key without the header is fine; the override key may send it.
    ok = httpx.post(
        base + "/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer plain"}
    )
    assert ok.status_code == 200
    admin = {"authorization": "Bearer admin", "x-guard-mode": "off"}
    r2 = httpx.post(base + "/v1/chat/completions", json=CHAT, headers=admin)
    assert r2.status_code == 200
    # mode off: the client's own stream flag reached the engine (not the guard's stream:true)
    assert fake_upstream.last.json.get("stream") is False


def test_override_keys_without_api_keys(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """No GUARD_API_KEYS: the proxy is open, but only override keys may send x-guard-mode."""
    base = proxy_server(override_api_keys=["admin"], allow_client_override=True)
    assert httpx.post(base + "/v1/chat/completions", json=CHAT).status_code == 200
    r = httpx.post(base + "/v1/chat/completions", json=CHAT, headers={"x-guard-mode": "off"})
    assert r.status_code == 403
    r2 = httpx.post(
        base + "/v1/chat/completions",
        json=CHAT,
        headers={"x-guard-mode": "off", "authorization": "Bearer admin"},
    )
    assert r2.status_code == 200


def test_protected_metrics_need_a_key(fake_upstream: FakeVLLM, proxy_server: ProxyFactory) -> None:
    base = proxy_server(api_keys=["api"], metrics_api_keys=["scraper"], protect_metrics=True)
    for path in ("/metrics", "/metrics/quality", "/metrics/"):
        assert httpx.get(base + path).status_code == 401
        assert httpx.get(base + path, headers={"authorization": "Bearer x"}).status_code == 401
        for key in ("api", "scraper"):
            r = httpx.get(base + path, headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 200, (path, key)
    # The scraper's key opens only the metrics.
    r = httpx.get(base + "/v1/models", headers={"authorization": "Bearer scraper"})
    assert r.status_code == 401
    # Health and readiness stay open for probes.
    assert httpx.get(base + "/health").status_code == 200
    assert httpx.get(base + "/ready").status_code == 200


def test_unprotected_metrics_are_open_even_with_api_keys(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server(api_keys=["api"])
    assert httpx.get(base + "/metrics").status_code == 200


def test_the_engines_metrics_path_takes_the_scrapers_key(proxy_server: ProxyFactory) -> None:
    """``/metrics/engine`` (the engine's exposition relayed: the PodMonitor's third endpoint)
    is opened by a GUARD_METRICS_API_KEYS key like the proxy's own metrics, so one scraper key
    reads all three; that key opens no other relayed path. With GUARD_PROTECT_METRICS and no
    GUARD_API_KEYS the engine's metrics are behind the scraper's key too."""
    routes: dict[str, str | int] = {"/metrics/engine": "vllm:up 1\n", "/metrics/other": "x 1\n"}
    with serve_exposition(routes) as engine:
        for api_keys in (["api"], []):
            base = proxy_server(
                upstream_url=engine.url,
                api_keys=api_keys,
                metrics_api_keys=["scraper"],
                protect_metrics=True,
            )
            for path in ("/metrics/engine", "//metrics/engine/"):
                assert httpx.get(base + path).status_code == 401
                bad = httpx.get(base + path, headers={"authorization": "Bearer x"})
                assert bad.status_code == 401
                for key in ("scraper", *api_keys):
                    r = httpx.get(base + path, headers={"authorization": f"Bearer {key}"})
                    assert (r.status_code, r.text) == (200, "vllm:up 1\n"), (path, key)
            other = httpx.get(base + "/metrics/other", headers={"authorization": "Bearer scraper"})
            assert other.status_code == (401 if api_keys else 200)


def test_protect_metrics_without_any_key_is_a_config_error(fake_upstream: FakeVLLM) -> None:
    with pytest.raises(ConfigError, match="GUARD_PROTECT_METRICS"):
        create_app(load_settings(upstream_url=fake_upstream.url, protect_metrics=True))


class _ContextRecorder(logging.Handler):
    """Records each message with the request id the contextvar held when it was logged."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[int, str, str | None]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage(), context.request_id.get()))


@pytest.fixture
def context_log() -> Iterator[_ContextRecorder]:
    handler = _ContextRecorder()
    logger = logging.getLogger("coherence_guard")
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def test_upstream_failures_are_logged_at_warning_with_the_request_id(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, context_log: _ContextRecorder
) -> None:
    """No text in the line; the request id comes from the contextvar the formatter reads."""
    secret = "do-not-log-this-prompt"
    body = {"model": "m", "messages": [{"role": "user", "content": secret}]}
    dead = proxy_server(upstream_url="http://127.0.0.1:9")  # nothing listens there
    r = httpx.post(dead + "/v1/chat/completions", json=body, headers={"x-request-id": "rid-1"})
    assert r.status_code == 502
    fake_upstream.script = Script(status=500)
    base = proxy_server()
    r2 = httpx.post(base + "/v1/chat/completions", json=body, headers={"x-request-id": "rid-2"})
    assert r2.status_code == 500
    warnings = [(msg, rid) for level, msg, rid in context_log.lines if level == logging.WARNING]
    assert ("upstream failed (kind=connect)", "rid-1") in warnings
    assert ("upstream answered 500", "rid-2") in warnings
    assert all(secret not in msg for _, msg, _ in context_log.lines)


def test_expect_is_not_forwarded(fake_upstream: FakeVLLM, proxy_server: ProxyFactory) -> None:
    """The proxy has read the body already; ``Expect: 100-continue`` toward the engine would
    only make it answer an interim response nobody asked it for."""
    base = proxy_server()
    headers = {"expect": "100-continue"}
    assert httpx.post(base + "/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
    assert "expect" not in fake_upstream.last.headers
    assert httpx.post(base + "/tokenize", json={"prompt": "a"}, headers=headers).status_code == 200
    assert "expect" not in fake_upstream.last.headers
