"""The resend of an idempotent request the engine closed unanswered lives in the transport of the
proxy's httpx client (:class:`proxy.server.upstream.ResendIdempotent`), so every user of that
client gets it: pass-through (``tests/test_app_passthrough.py``), and the two the proxy sends on
its own account, tested here. Had it lived in pass-through alone, a model look-up or a readiness
check that found its pooled connection closed by the engine would report a failure for a
request the engine never answered.

The engine (:class:`tests.conftest.CannedEngine`) answers one request per connection and closes
the connection on the next one unanswered: what an engine does when its idle timeout ends a
keep-alive connection just as the proxy reuses it.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import orjson

from tests.conftest import CannedEngine

ProxyFactory = Callable[..., str]


def _answer(body: bytes, content_type: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: %b\r\ncontent-length: %d\r\n\r\n%b" % (
        content_type,
        len(body),
        body,
    )


OK = _answer(b'{"ok":true}')
MODELS = _answer(
    orjson.dumps(
        {"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 4096}]}
    )
)
CHUNK = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "m",
    "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": "Hi."}, "finish_reason": "stop"}
    ],
}
STREAM = _answer(b"data: " + orjson.dumps(CHUNK) + b"\n\ndata: [DONE]\n\n", b"text/event-stream")


def test_the_model_look_up_is_sent_again_when_the_engine_closed_its_connection(
    proxy_server: ProxyFactory, canned_engine: Callable[..., CannedEngine]
) -> None:
    """The first request for a model looks up its context (``GET /v1/models``) on the
    connection a pass-through request left in the pool; the engine closes it unanswered. The
    look-up is sent again and learns the context: the request goes out with the engine's own
    limit (4096, below the default), not the default the proxy falls back to when it knows
    none."""
    engine = canned_engine(
        OK,
        answers_per_connection=1,
        routes={b"/v1/models": MODELS, b"/v1/chat/completions": STREAM},
    )
    base = proxy_server(upstream_url=engine.url, upstream_check_interval=0)
    with httpx.Client(base_url=base) as client:
        assert client.get("/version").status_code == 200  # leaves a connection in the pool
        resp = client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "Hello?"}]},
        )
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "Hi."
    assert resp.headers["x-guard-max-tokens"] == "engine; value=4096"
    assert [h.split(b" ", 2)[:2] for h in engine.dropped] == [[b"GET", b"/v1/models"]]


def test_readiness_is_sent_again_when_the_engine_closed_its_connection(
    proxy_server: ProxyFactory, canned_engine: Callable[..., CannedEngine]
) -> None:
    """``/ready`` asks the engine on the pooled connection the previous check left; the engine
    closes it unanswered each time. Each check is sent again and reports the engine ready,
    never 503 for a request the engine did not answer."""
    engine = canned_engine(OK, answers_per_connection=1)
    base = proxy_server(upstream_url=engine.url, upstream_check_interval=0)
    with httpx.Client(base_url=base) as client:
        answers = [client.get("/ready") for _ in range(3)]
    assert [(r.status_code, r.json()) for r in answers] == [(200, {"status": "ready"})] * 3
    # Every check after the first found the previous one's pooled connection, closed on it.
    assert len(engine.dropped) == 2
    assert all(head.startswith(b"GET /health ") for head in engine.dropped)
