"""Retries of a request the guard aborted as a loop: the memory (pure) and the app's use of it,
through real uvicorn and the openai SDK in front of the fake engine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest

from proxy.core.retries import AbortMemory, defended, request_key, retry_keys
from tests.conftest import Clients
from tests.fakes.vllm import FakeVLLM, Script

LOOP = "The answer is the answer. " * 200


# ---------------------------------------------------------------- the memory (pure)
def test_key_ignores_key_order_and_spacing_but_not_content_or_route() -> None:
    a = request_key("chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    b = request_key("chat", {"messages": [{"content": "hi", "role": "user"}], "model": "m"})
    assert a == b and len(a) == 16
    assert request_key("chat", {"model": "m", "messages": []}) != a
    assert request_key("completions", {"model": "m"}) != request_key("chat", {"model": "m"})
    assert request_key("chat", {"n": 2**70}) != request_key("chat", {"n": 2**70 + 1})


def test_a_reask_is_looked_up_without_its_reply_and_correction() -> None:
    """instructor's re-ask: the cut reply as an assistant message, then the validation error."""
    asked = {"model": "m", "messages": [{"role": "system", "content": "JSON"},
                                        {"role": "user", "content": "Give JSON."}]}  # fmt: skip
    reask = {
        **asked,
        "messages": [
            *asked["messages"],
            {"role": "assistant", "content": '{"a": "the the the'},
            {"role": "user", "content": "Correct your JSON: it does not parse."},
        ],
    }
    key, none = retry_keys("chat", asked)
    assert none is None
    own, parent = retry_keys("chat", reask)
    assert parent == key and own != key
    two_users = {**asked, "messages": [*asked["messages"], {"role": "user", "content": "more"}]}
    assert retry_keys("chat", two_users)[1] is None
    assert retry_keys("completions", {"prompt": "x"})[1] is None


def test_memory_expires_after_the_window() -> None:
    m = AbortMemory(size=8, ttl=10.0)
    m.remember(b"k", now=100.0)
    assert m.aborted_recently(b"k", now=109.9)
    assert not m.aborted_recently(b"k", now=110.0)
    assert len(m) == 0


def test_memory_is_bounded_and_drops_the_oldest() -> None:
    m = AbortMemory(size=3, ttl=60.0)
    for i in range(5):
        m.remember(bytes([i]), now=float(i))
    assert len(m) == 3
    assert [m.aborted_recently(bytes([i]), now=5.0) for i in range(5)] == [
        False,
        False,
        True,
        True,
        True,
    ]
    m.remember(bytes([2]), now=6.0)  # aborted again: the newest now
    m.remember(bytes([9]), now=7.0)
    assert m.aborted_recently(bytes([2]), now=7.0)
    assert not m.aborted_recently(bytes([3]), now=7.0)
    m.forget(bytes([2]))
    assert not m.aborted_recently(bytes([2]), now=7.0)


def test_a_zero_window_remembers_nothing() -> None:
    m = AbortMemory(size=3, ttl=0.0)
    m.remember(b"k", now=0.0)
    assert len(m) == 0


def test_defences_raise_penalties_and_leave_the_clients_higher_ones() -> None:
    body = {"model": "m", "temperature": 0, "repetition_penalty": 1.0}
    out = defended(body, repetition_penalty=0.1, frequency_penalty=0.3, temperature=0.3)
    assert out == {
        "model": "m",
        "temperature": 0.3,
        "repetition_penalty": 1.1,
        "frequency_penalty": 0.3,
    }
    assert body["temperature"] == 0  # the input is not changed
    strong = {"repetition_penalty": 1.5, "frequency_penalty": 1.0, "temperature": 0.7}
    assert defended(strong, repetition_penalty=0.1, frequency_penalty=0.3, temperature=0.3) == (
        strong
    )


# ---------------------------------------------------------------- the app
def _ask(client: openai.OpenAI, prompt: str, **kw: Any) -> Any:
    return client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": prompt}], temperature=0, **kw
    )


def _continuations(fake: FakeVLLM) -> int:
    return sum(1 for r in fake.guarded_requests() if (r.json or {}).get("continue_final_message"))


def test_an_aborted_request_sent_again_is_healed(
    fake_upstream: FakeVLLM, proxy_server: Callable[..., str], sdk: Clients
) -> None:
    fake_upstream.script = Script(texts=["Fine start. " + LOOP])
    client = sdk.openai(proxy_server())
    first = _ask(client, "Tell me.")
    assert first.choices[0].finish_reason == "content_filter"
    assert _continuations(fake_upstream) == 0
    other = _ask(client, "Tell me something else.")  # not a retry: enforce again
    assert other.choices[0].finish_reason == "content_filter"
    assert _continuations(fake_upstream) == 0
    retry = _ask(client, "Tell me.")
    assert _continuations(fake_upstream) >= 1  # heal continued the cut answer
    guard = (retry.choices[0].model_extra or {})["guard"]
    assert guard["attempts"] >= 1


def test_retries_can_be_turned_off(
    fake_upstream: FakeVLLM, proxy_server: Callable[..., str], sdk: Clients
) -> None:
    fake_upstream.script = Script(texts=["Fine start. " + LOOP])
    client = sdk.openai(proxy_server(retry_after_abort="off"))
    for _ in range(2):
        assert _ask(client, "Tell me.").choices[0].finish_reason == "content_filter"
    assert _continuations(fake_upstream) == 0


@pytest.mark.parametrize("setting", ["heal", "defend"])
def test_a_structured_retry_goes_out_with_raised_defences(
    fake_upstream: FakeVLLM, proxy_server: Callable[..., str], sdk: Clients, setting: str
) -> None:
    """A continuation would restart a JSON schema mid-string: the retry of a structured request
    is sent whole again, with the penalties raised and greedy decoding made sampled."""
    fake_upstream.script = Script(texts=['{"a": "' + LOOP])
    client = sdk.openai(proxy_server(retry_after_abort=setting))
    fmt = {"response_format": {"type": "json_object"}}
    _ask(client, "Give JSON.", **fmt)
    _ask(client, "Give JSON.", **fmt)
    first, second = (r.json for r in fake_upstream.guarded_requests())
    assert first["temperature"] == 0 and "frequency_penalty" not in first
    assert second["temperature"] == 0.3
    assert second["repetition_penalty"] == 1.1 and second["frequency_penalty"] == 0.3
    assert _continuations(fake_upstream) == 0
