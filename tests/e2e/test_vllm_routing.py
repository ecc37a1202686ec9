"""Routing in front of the real vLLM: the spellings its own router accepts are guarded, and its
redirects never show the client where it is.

What only the real engine can prove: that vLLM really answers a trailing-slash spelling of the
chat route with a redirect naming its own address (the leak the proxy closes), and that every
spelling through the proxy reaches vLLM's chat route, guarded.
"""

from __future__ import annotations

import http.client
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from tests.e2e.support import GREEDY, ProxyFactory, Server

pytestmark = pytest.mark.e2e


def _post_raw(base: str, target: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    """POST with the target exactly as written (httpx would normalise it)."""
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=180)
    data = orjson.dumps(body)
    conn.putrequest("POST", target, skip_accept_encoding=True)
    conn.putheader("content-type", "application/json")
    conn.putheader("content-length", str(len(data)))
    conn.endheaders(data)
    resp = conn.getresponse()
    payload = resp.read()
    headers = {k.lower(): v for k, v in resp.getheaders()}
    conn.close()
    return resp.status, headers, payload


def test_vllm_redirects_a_trailing_slash_to_its_own_address(
    vllm_engine: Server, model_name: str
) -> None:
    """The engine's behaviour the proxy must not relay as it is (pinned: if vLLM changes it,
    this says so)."""
    body = {"model": model_name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    status, headers, _ = _post_raw(vllm_engine.url, "/v1/chat/completions/", body)
    assert status == 307
    assert headers["location"].startswith(vllm_engine.url)


@pytest.mark.parametrize(
    "target", ["/v1/chat/completions/", "//v1/chat/completions", "/v1%2Fchat%2Fcompletions"]
)
def test_every_spelling_is_guarded_in_front_of_vllm(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str, target: str
) -> None:
    proxy = start_proxy(vllm_engine, max_tokens_default=8)
    body = {"model": model_name, "messages": [{"role": "user", "content": "Hi"}], **GREEDY}
    status, headers, payload = _post_raw(proxy.url, target, body)
    assert status == 200, payload[:300]
    assert headers["x-guard-max-tokens"] == "defaulted; value=8"
    answer = orjson.loads(payload)
    assert answer["object"] == "chat.completion"
    assert answer["usage"]["completion_tokens"] <= 8
    assert "location" not in headers


def test_pass_through_spellings_reach_the_route_not_a_redirect(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    proxy = start_proxy(vllm_engine)
    r = httpx.get(proxy.url + "/v1/models/", timeout=30)
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == [model_name]
    assert str(urlsplit(vllm_engine.url).port) not in str(r.headers)


def test_unguarded_generating_routes_are_refused_with_reject(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    proxy = start_proxy(vllm_engine, unguarded_routes="reject")
    body = {
        "model": model_name,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
    }
    for target in ("/invocations", "/invocations/", "//inference/v1/generate"):
        status, _, payload = _post_raw(proxy.url, target, body)
        assert status == 403, (target, payload[:200])
    # Passed by default: vLLM answers it (SageMaker's entry point dispatches a chat body).
    passing = start_proxy(vllm_engine)
    status, _, payload = _post_raw(passing.url, "/invocations", body)
    assert status == 200, payload[:300]
