"""The requested language with a real engine: SmolLM2-135M on llama.cpp answers in English
whatever it is asked, which is itself a source of real wrong-language answers.

An English prompt that asks for Indonesian expects Indonesian (the request, not the prompt's
language), and so does a short Indonesian question, so the English answers are cut and the
guard object says why; with ``GUARD_LANGUAGE=auto`` a
French prompt that asks for English gets the English instruction, and the English answer is
the engine's own, untouched.
"""

from __future__ import annotations

import pytest

from tests.e2e.support import GREEDY, ProxyFactory, Server

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("prompt", "source"),
    [
        # An English prompt that asks for Indonesian: the answer is wholly English.
        ("Reply in Indonesian. Explain how a rainbow forms.", "request"),
        # An Indonesian question: three Indonesian-looking words, then English to the end.
        ("Jelaskan bagaimana pelangi terbentuk.", "prompt"),
    ],
)
def test_english_answer_to_an_indonesian_request_is_cut(
    llama_engine: Server, start_proxy: ProxyFactory, model_name: str, prompt: str, source: str
) -> None:
    proxy = start_proxy(llama_engine)
    raw = proxy.openai().chat.completions.with_raw_response.create(
        model=model_name,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=300,
        **GREEDY,
    )
    assert raw.headers["x-guard-language"].startswith(f"id; source={source}")
    choice = raw.parse().choices[0]
    assert choice.finish_reason == "content_filter", choice.message.content
    guard = (choice.model_extra or {})["guard"]
    assert guard["signal"] == "language-drift"
    assert (guard["expected_language"], guard["language_source"]) == ("id", source)


def test_auto_follows_a_request_for_english_in_a_french_prompt(
    llama_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    proxy = start_proxy(llama_engine, language="auto")
    messages = [
        {"role": "system", "content": "Respond only in English. Do not use any other language."},
        {
            "role": "user",
            "content": "Explique comment se forme un arc-en-ciel. Réponds en anglais.",
        },
    ]
    kwargs = {"model": model_name, "max_tokens": 120, **GREEDY}
    raw = proxy.openai().chat.completions.with_raw_response.create(messages=[messages[1]], **kwargs)
    assert raw.headers["x-guard-language"] == (
        "en; source=request; by=instruction; strength=strong"
    )
    guarded = raw.parse().choices[0]
    # What the proxy sent is what the engine answers to the same request with that instruction.
    direct = llama_engine.openai().chat.completions.create(messages=messages, **kwargs)
    assert guarded.message.content == direct.choices[0].message.content
    assert guarded.finish_reason == direct.choices[0].finish_reason
