"""Everything that is not a guarded route is relayed as it is; health, readiness, metrics."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import openai

from proxy.observability.metrics import Metrics
from tests.conftest import CannedEngine
from tests.fakes.vllm import FakeVLLM, Script

ProxyFactory = Callable[..., str]


def test_models_via_openai_sdk(fake_upstream: FakeVLLM, proxy_server: ProxyFactory) -> None:
    client = openai.OpenAI(base_url=proxy_server() + "/v1", api_key="x", max_retries=0)
    assert [m.id for m in client.models.list()] == ["fake-model"]


def test_method_query_headers_and_body_are_relayed(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server()
    r = httpx.post(
        base + "/tokenize?add_special_tokens=false&x=%2F",
        json={"prompt": "héllo"},
        headers={"x-custom": "1", "authorization": "Bearer abc"},
    )
    assert r.status_code == 200
    assert r.headers["x-fake"] == "yes"
    assert r.json() == {
        "path": "/tokenize?add_special_tokens=false&x=%2F",
        "method": "POST",
        "body": {"prompt": "héllo"},
    }
    seen = fake_upstream.last.headers
    assert seen["x-custom"] == "1" and seen["authorization"] == "Bearer abc"
    assert "connection" not in seen or seen["connection"] == "keep-alive"
    r = httpx.get(base + "/version")
    assert r.json() == {"version": "0.11.0"}


def test_upstream_404_and_405_are_relayed(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server()
    r = httpx.get(base + "/nope")
    assert r.status_code == 404 and r.json() == {"detail": "Not Found"}
    # A GET on a guarded path is not guarded: it goes to the upstream as is.
    assert httpx.get(base + "/v1/chat/completions").status_code == 404
    assert fake_upstream.last.method == "GET"


def test_health_and_ready(fake_upstream: FakeVLLM, proxy_server: ProxyFactory) -> None:
    base = proxy_server()
    assert httpx.get(base + "/health").json() == {"status": "ok"}
    assert httpx.get(base + "/ready").json() == {"status": "ready"}
    assert fake_upstream.last.path == "/health"


class _Recording(Metrics):
    def render_infra(self) -> tuple[bytes, str]:
        return b"infra_metric 1\n", "text/plain; version=0.0.4; charset=utf-8"

    def render_quality(self, accept: str = "") -> tuple[bytes, str]:
        return b"quality_metric 1\n", "text/plain; version=0.0.4; charset=utf-8"


def test_metrics_endpoints_render_the_two_registries(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server(metrics=_Recording())
    r = httpx.get(base + "/metrics")
    assert r.text == "infra_metric 1\n" and r.headers["content-type"].startswith("text/plain")
    assert httpx.get(base + "/metrics/quality").text == "quality_metric 1\n"
    assert fake_upstream.requests == []


def test_streaming_bodies_are_relayed_as_they_come(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """A streamed pass-through answer (named SSE events) reaches the client event by event."""
    words = " ".join(f"w{i}" for i in range(20))
    fake_upstream.script = Script(texts=[words], chunk_delay=0.05)
    base = proxy_server()
    with httpx.stream("POST", base + "/v1/stream", json={"model": "m", "input": "x"}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        chunks = r.iter_raw()
        first = next(chunks)
        rec = fake_upstream.last
        # The first event arrived while the upstream was still far from done.
        assert first.startswith(b"event: response.output_text.delta\ndata: ")
        assert rec.chunks_sent < 20 and not rec.completed
        rest = b"".join(chunks)
    assert (first + rest).count(b"event: response.output_text.delta") == 20


def test_split_upstream_writes_give_identical_client_bytes(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """TCP writes of 1 to 7 bytes (UTF-8 characters cut anywhere) change nothing."""
    text = "Café — naïve 日本語 🙂 line\u2028separator; and a healthy sentence to finish."
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    fake_upstream.script = Script(texts=[text])
    direct = httpx.post(fake_upstream.url + "/v1/chat/completions", json=body).content
    base = proxy_server()
    fake_upstream.script = Script(texts=[text], write_sizes=[1, 2, 3, 5, 7])
    assert httpx.post(base + "/v1/chat/completions", json=body).content == direct


def test_upstream_url_given_with_v1_suffix(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server(upstream_url=fake_upstream.url + "/v1/")
    r = httpx.post(
        base + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 200
    assert httpx.get(base + "/v1/models").status_code == 200
    assert [r.path for r in fake_upstream.client_requests] == ["/v1/chat/completions", "/v1/models"]


OK_ANSWER = (
    b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'
)


def test_a_get_the_engine_closed_unanswered_is_sent_again(
    proxy_server: ProxyFactory, canned_engine: Callable[..., CannedEngine]
) -> None:
    """An engine that closes a keep-alive connection just as the proxy reuses it (uvicorn's idle
    timeout, a restart) leaves a request unanswered: an idempotent one is sent once more on another
    connection, so the client gets the engine's answer rather than a 502."""
    engine = canned_engine(OK_ANSWER, answers_per_connection=1)
    base = proxy_server(upstream_url=engine.url)
    with httpx.Client(base_url=base) as client:
        answers = [client.get("/version") for _ in range(3)]
    assert [(r.status_code, r.json()) for r in answers] == [(200, {"ok": True})] * 3
    # Every request after the first found the previous one's pooled connection, which the
    # engine then closed unanswered.
    assert len(engine.heads) == 3 and len(engine.dropped) >= 2
    assert all(head.startswith(b"GET /version ") for head in engine.dropped)


def test_a_post_the_engine_closed_unanswered_is_not_sent_again(
    proxy_server: ProxyFactory, canned_engine: Callable[..., CannedEngine]
) -> None:
    """A POST may have started work on the engine: it is never sent twice, and the client gets
    the engine failure."""
    engine = canned_engine(OK_ANSWER, answers_per_connection=1)
    base = proxy_server(upstream_url=engine.url)
    with httpx.Client(base_url=base) as client:
        first = client.post("/tokenize", json={"prompt": "a"})
        second = client.post("/tokenize", json={"prompt": "b"})
    assert first.status_code == 200
    assert second.status_code == 502
    posts = [h for h in engine.heads + engine.dropped if h.startswith(b"POST /tokenize ")]
    assert len(posts) == 2  # each POST reached the engine once
