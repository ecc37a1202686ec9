"""The requested language through a running proxy: the client's ``x-guard-language`` (where
allowed), the ``x-guard-language`` response header, the guard object of a language abort and
the ``guard_language_expectation_total`` metric, with the real openai client."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import openai
import pytest

from proxy.observability.metrics import Metrics
from tests.fakes.vllm import FakeVLLM, Script

ProxyFactory = Callable[..., str]

ENGLISH = (
    "A rainbow forms when sunlight enters raindrops, bends, reflects off the back of each drop "
    "and bends again on the way out. Each colour bends by a slightly different angle, so the "
    "white light spreads into a band of colours, red on the outside and violet inside. You see "
    "it with the sun behind you and the rain in front of you, at about forty-two degrees. "
    "Sometimes a second, fainter bow appears above the first one: the light has reflected twice "
    "inside each drop, which turns the order of the colours around, so red is on the inside. "
    "Between the two bows the sky looks darker, a band called Alexander's dark band, because "
    "no drop there sends light towards your eyes. A rainbow is not an object at a place: every "
    "observer sees their own one, made by different drops, and it moves when you move. From an "
    "aeroplane you can even see the whole circle, since the ground no longer hides its lower "
    "half, and a garden hose on a sunny afternoon makes a small one you can walk around. "
)
ASK = "Explain how a rainbow forms, for a curious teenager. Reply in French."


def test_english_answer_to_a_french_request_is_aborted_and_says_why(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """GUARD_LANGUAGE=auto injects French (never English) and the English answer is cut;
    the guard object and the response header say French was expected because it was asked."""
    fake_upstream.script = Script(texts=[ENGLISH])
    metrics = Metrics()
    base = proxy_server(language="auto", metrics=metrics)
    client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": ASK}], max_tokens=400
    )
    assert raw.headers["x-guard-language"] == (
        "fr; source=request; by=instruction; strength=strong"
    )
    choice = raw.parse().choices[0]
    assert choice.finish_reason == "content_filter"
    guard = (choice.model_extra or {})["guard"]
    assert guard["signal"] == "language-drift"
    assert (guard["expected_language"], guard["language_source"]) == ("fr", "request")
    sent = fake_upstream.guarded_requests()[0].json["messages"]
    assert sent[0] == {
        "role": "system",
        "content": "Réponds uniquement en français. N'utilise aucune autre langue.",
    }
    text = metrics.render_quality()[0].decode()
    assert (
        'guard_language_expectation_total{model="m",source="request",strength="strong"} 1.0' in text
    )


@pytest.mark.parametrize("allowed", [False, True])
def test_client_language_header_only_where_allowed(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, allowed: bool
) -> None:
    """``x-guard-language: en`` makes the English answer right (when the operator allows
    client overrides); it never reaches the engine; a value that is no language is a 400."""
    fake_upstream.script = Script(texts=[ENGLISH])
    base = proxy_server(allow_client_override=allowed)
    body = {"model": "m", "messages": [{"role": "user", "content": ASK}], "max_tokens": 400}
    r = httpx.post(base + "/v1/chat/completions", json=body, headers={"x-guard-language": "en"})
    assert r.status_code == 200
    assert "x-guard-language" not in fake_upstream.last.headers
    finish = r.json()["choices"][0]["finish_reason"]
    if allowed:
        assert r.headers["x-guard-language"] == "en; source=request; by=header; strength=strong"
        assert finish == "stop"
        bad = httpx.post(
            base + "/v1/chat/completions", json=body, headers={"x-guard-language": "klingon"}
        )
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "x-guard-language"
    else:
        assert r.headers["x-guard-language"] == (
            "fr; source=request; by=instruction; strength=strong"
        )
        assert finish == "content_filter"


@pytest.mark.parametrize(("value", "code"), [("Français", "fr"), ("中文", "zh"), ("日本語", "ja")])
def test_a_language_named_in_its_own_script_is_read_as_utf8(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, value: str, code: str
) -> None:
    """A client sends ``x-guard-language: Français`` as UTF-8 bytes (HTTP reads header bytes as
    Latin-1, where "Français" was 'FranÃ§ais' and a 400): the language is read, the answer is
    served, and the header never reaches the engine."""
    fake_upstream.script = Script(texts=["Bonjour."])
    base = proxy_server(allow_client_override=True)
    body = {"model": "m", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 20}
    headers = [(b"x-guard-language", value.encode("utf-8"))]
    r = httpx.post(base + "/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["x-guard-language"] == f"{code}; source=request; by=header; strength=strong"
    assert "x-guard-language" not in fake_upstream.last.headers
