"""Heal is judged by its result: a continuation that degenerates again (gibberish, salad, a loop
judged when it ended) ends the answer as an abort at the last good point, never as "healed";
a structured-output answer is asked again whole under its constraint and must parse, or it
ends as ``enforce`` ends it. Through the proxy with the official openai SDK against the fake
vLLM, which answers the first request with a loop and the next ones as scripted."""

from __future__ import annotations

import random
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel

from proxy.core.heal_request import (
    HealPolicy,
    constrained,
    continuation_request,
    unhealable,
    valid_json,
)
from proxy.detect import Detector
from proxy.detect.salad import SALAD_LANGUAGES, lexicon
from proxy.observability.metrics import Metrics
from tests.conftest import Clients
from tests.fakes.vllm import FakeVLLM, Script
from tests.test_heal import (
    KEPT,
    LOOPING,
    MESSAGES,
    ProxyFactory,
    data_events,
    recorded,
    streamed_text,
)

#: The good start of a continuation, then what heal's raised penalties turned real answers
#: into (the issue's report: capitals run together, words with no space between them).
GOOD = " The fox found a new path along the river and followed it for a while."
REPORTED = "O GUIBRANCULA KEDSCARMAXNASDFUCTIONALFIAAWHEREMPACK TheoLloydBhcatenadonathatwasone"


@pytest.fixture(autouse=True, scope="module")
def _word_lists() -> None:
    """Load the word lists the proxy loads as it starts before the first proxy starts, so the
    first request's wait for them does not depend on how fast this machine reads them."""
    for language in sorted(SALAD_LANGUAGES):
        lexicon(language)


def _gibberish(chars: int = 1500) -> str:
    rng = random.Random(3)
    words = REPORTED.split()
    out = ""
    while len(out) < chars:
        out += " " + rng.choice(words)
    return out


def test_a_continuation_that_turns_to_gibberish_ends_as_an_abort_at_the_last_good_point(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """No further attempt (it would raise the penalties that caused it), action ``aborted``
    with the attempts made, and no byte of the gibberish reaches the client."""
    fake_upstream.scripts = [Script(texts=[LOOPING]), Script(texts=[GOOD + _gibberish()])]
    metrics = Metrics()
    base = proxy_server(mode="heal", heal_max_attempts=3, metrics=metrics)
    body = {"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 2000}
    raw = httpx.post(base + "/v1/chat/completions", json=body).content
    events = data_events(raw)
    assert len(fake_upstream.guarded_requests()) == 2
    final = events[-1]["choices"][0]
    assert final["finish_reason"] == "content_filter"
    assert final["stop_reason"] == "coherence_guard:gibberish"
    assert final["guard"]["action"] == "aborted" and final["guard"]["attempts"] == 1
    text = streamed_text(events)
    assert text == KEPT.rstrip() + GOOD
    for word in REPORTED.split()[1:]:
        assert word.encode() not in raw
    assert recorded(metrics, "guard_heals_total") == 1
    q = metrics.quality_registry
    assert q.get_sample_value("guard_heal_successes_total", {"model": "m"}) is None


def stream_verdicts(text: str) -> tuple[bool, bool]:
    """Whether the detector fires on ``text`` while it streams, and when it ends."""
    detector = Detector()
    streaming = any(detector.feed(text[i : i + 4]) for i in range(0, len(text), 4))
    return streaming, detector.finish().verdict is not None


def test_a_continuation_judged_degenerate_when_it_ends_is_not_healed(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    """Too short for the streaming windows, a continuation that ends in a short loop is caught
    by the end-of-stream judgement, and (no attempt left) the answer ends at the cut, as an
    abort."""
    tail = " The end of it all." * 8  # no streaming verdict; the end-of-stream one (tested)
    assert stream_verdicts(GOOD + tail) == (False, True)
    fake_upstream.scripts = [Script(texts=[LOOPING]), Script(texts=[GOOD + tail])]
    client = sdk.openai(proxy_server(mode="heal", heal_max_attempts=1))
    stream = client.chat.completions.create(
        model="m",
        messages=MESSAGES,  # type: ignore[arg-type]
        stream=True,
        max_tokens=1000,
    )
    chunks = list(stream)
    final = chunks[-1].choices[0]
    guard: dict[str, Any] = final.model_extra["guard"]  # type: ignore[index]
    assert final.finish_reason == "content_filter"
    assert guard["action"] == "aborted"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # The repeating starts with the second copy: the first is content. (A periodic loop's copies
    # reach into the word before them: "while." ends like "all.", so the cut falls before a
    # full stop.)
    assert text == KEPT.rstrip() + GOOD + " The end of it all"


class Person(BaseModel):
    name: str
    bio: str


LOOPING_JSON = '{"name": "Ada Lovelace", "bio": "' + "She wrote the notes. " * 200
WHOLE_JSON = '{"name": "Ada Lovelace", "bio": "Mathematician and writer."}'


def test_parse_accepts_a_structured_answer_asked_again_whole(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    """vLLM's grammar starts again at a continuation's first token, so a cut JSON answer cannot
    be continued: it is asked again from its start, under the same ``response_format``, with
    the attempt's anti-repetition; the client's ``.parse()`` reads it."""
    fake_upstream.scripts = [Script(texts=[LOOPING_JSON]), Script(texts=[WHOLE_JSON])]
    client = sdk.openai(proxy_server(mode="heal"))
    resp = client.chat.completions.parse(
        model="m",
        messages=MESSAGES,  # type: ignore[arg-type]
        response_format=Person,
        max_tokens=1000,
    )
    assert resp.choices[0].message.parsed == Person(
        name="Ada Lovelace", bio="Mathematician and writer."
    )
    assert resp.choices[0].model_extra["guard"]["action"] == "healed"  # type: ignore[index]
    first, again = (r.json for r in fake_upstream.guarded_requests())
    assert again["messages"] == first["messages"] == MESSAGES
    assert "continue_final_message" not in again
    assert again["response_format"] == first["response_format"]
    assert again["repetition_penalty"] > 1.0
    assert again["max_tokens"] == 1000


def test_a_structured_answer_that_does_not_parse_ends_as_enforce(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    """A raw control character inside a string (what a healed answer held on vLLM) is not
    JSON: the answer ends as enforce ends it, and ``.parse()`` raises the same error."""
    broken = '{"name": "Ada\u0001 Lovelace", "bio": "Mathematician and writer."}'
    fake_upstream.scripts = [Script(texts=[LOOPING_JSON]), Script(texts=[broken])]
    client = sdk.openai(proxy_server(mode="heal"))
    with pytest.raises(openai.ContentFilterFinishReasonError):
        client.chat.completions.parse(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            response_format=Person,
            max_tokens=1000,
        )


def test_a_streamed_structured_answer_is_left_to_enforce(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """Streamed, the client already holds the start of the JSON: no continuation, no restart."""
    fake_upstream.script = Script(texts=[LOOPING_JSON])
    base = proxy_server(mode="heal")
    body = {
        "model": "m",
        "messages": MESSAGES,
        "stream": True,
        "max_tokens": 1000,
        "response_format": {"type": "json_object"},
    }
    final = data_events(httpx.post(base + "/v1/chat/completions", json=body).content)[-1]
    assert final["choices"][0]["finish_reason"] == "content_filter"
    assert "guard" not in final["choices"][0] or final["choices"][0]["guard"].get("attempts") in (
        None,
        0,
    )
    assert len(fake_upstream.guarded_requests()) == 1


# ---------------------------------------------------------------- the pure parts


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, True),
        ({"response_format": {"type": "json_object"}}, True),
        ({"response_format": {"type": "text"}}, False),
        ({"guided_regex": "a+"}, True),
        ({"structured_outputs": {"choice": ["a", "b"]}}, True),
        ({}, False),
    ],
)
def test_constrained(body: dict[str, Any], expected: bool) -> None:
    assert constrained(body) is expected
    body = {**body, "messages": MESSAGES, "stream": True}  # the proxy always streams upstream
    assert (unhealable("chat", body, 1, client_stream=True) == "constrained-stream") is expected
    assert unhealable("chat", body, 1, client_stream=False) is None


def test_restart_request_keeps_the_messages_and_steps_anti_repetition_up() -> None:
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 500, "temperature": 0}
    out = continuation_request(body, "chat", "", 500, 1, HealPolicy(), restart=True)
    assert out["messages"] == MESSAGES
    assert "continue_final_message" not in out and "add_generation_prompt" not in out
    assert out["repetition_penalty"] > 1.0 and out["temperature"] > 0


@pytest.mark.parametrize(
    ("text", "ok"),
    [('{"a": "x"}', True), ('{"a": "x\ny"}', False), ('{"a": ', False), ("[1, 2]", True)],
)
def test_valid_json_is_strict(text: str, ok: bool) -> None:
    assert valid_json(text) is ok


def test_anti_repetition_rises_to_a_bound_and_never_below_the_request() -> None:
    """Past the second step the raised penalties make a small model write salad, then
    gibberish (bench/data/gibberish.jsonl): attempts beyond it keep the bound."""
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 500, "temperature": 0}
    out = continuation_request(body, "chat", "x", 500, 5, HealPolicy())
    assert out["repetition_penalty"] == pytest.approx(1.2)
    assert out["frequency_penalty"] == pytest.approx(0.6)
    assert out["temperature"] == pytest.approx(0.6)
    strong = {**body, "repetition_penalty": 1.5, "frequency_penalty": 1.0}
    out = continuation_request(strong, "chat", "x", 500, 1, HealPolicy())
    assert out["repetition_penalty"] == pytest.approx(1.5)
    assert out["frequency_penalty"] == pytest.approx(1.0)


def test_a_continuation_with_more_invented_words_than_the_answer_is_not_a_heal(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """Too short for a streaming salad window, and English salad is not judged at the end of
    an ordinary stream: the heal's own judgement of the continuation's vocabulary (against the
    kept answer, whose language it identified) ends it as an abort."""
    salad = (
        " The lookje hugoutmeclus went stemetethe brainmanright with yftenng and nasthis,"
        " then clearanceptvenimen estimmine rezzesently planningally omndang."
    )
    fake_upstream.scripts = [Script(texts=[LOOPING]), Script(texts=[salad])]
    base = proxy_server(mode="heal", heal_max_attempts=3)
    body = {"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 2000}
    events = data_events(httpx.post(base + "/v1/chat/completions", json=body).content)
    final = events[-1]["choices"][0]
    assert final["finish_reason"] == "content_filter"
    assert final["stop_reason"] == "coherence_guard:salad"
    assert final["guard"]["action"] == "aborted" and final["guard"]["attempts"] == 1
    assert streamed_text(events) == KEPT.rstrip()
    assert len(fake_upstream.guarded_requests()) == 2
