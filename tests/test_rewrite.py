"""Request rewriting: pure functions over the client's dict, unknown fields untouched."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from proxy.core.language_rule import language_instruction
from proxy.core.records import Endpoint
from proxy.core.rewrite import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    RewritePolicy,
    rewrite_request,
)
from proxy.errors import BadRequest

POLICY = RewritePolicy(max_tokens_default=8192, max_tokens_cap=16384)


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_client_dict_is_not_modified_and_unknown_fields_survive() -> None:
    """The rewriter patches a copy and passes fields it doesn't know through verbatim."""
    body = chat(top_k=7, vendor_extension={"a": [1, 2]}, stream=True)
    before = copy.deepcopy(body)
    out = rewrite_request(body, "chat", POLICY).body
    assert body == before
    assert out["top_k"] == 7
    assert out["vendor_extension"] == {"a": [1, 2]}


def test_missing_limit_gets_the_default() -> None:
    """A chat request with no limit would otherwise run to the end of the context."""
    rw = rewrite_request(chat(), "chat", POLICY)
    assert rw.body["max_tokens"] == 8192
    assert "max_completion_tokens" not in rw.body
    assert (rw.max_tokens, rw.max_tokens_action) == (8192, "defaulted")
    assert rw.max_tokens_header == "defaulted; value=8192"


def test_null_limit_counts_as_missing() -> None:
    rw = rewrite_request(chat(max_tokens=None), "chat", POLICY)
    assert rw.body["max_tokens"] == 8192


def test_default_never_exceeds_cap() -> None:
    rw = rewrite_request(chat(), "chat", RewritePolicy(max_tokens_default=9000, max_tokens_cap=100))
    assert rw.body["max_tokens"] == 100


def test_completions_default_is_the_documented_sixteen() -> None:
    """/v1/completions keeps OpenAI's documented default, made explicit for other engines."""
    rw = rewrite_request({"model": "m", "prompt": "x"}, "completions", POLICY)
    assert rw.body["max_tokens"] == COMPLETIONS_DEFAULT_MAX_TOKENS
    assert rw.max_tokens_action == "defaulted"


def test_limit_within_cap_is_unchanged() -> None:
    rw = rewrite_request(chat(max_tokens=300), "chat", POLICY)
    assert rw.body["max_tokens"] == 300
    assert (rw.max_tokens, rw.max_tokens_action) == (300, None)
    assert rw.max_tokens_header == "unchanged; value=300"


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_limit_over_cap_is_clamped(field: str) -> None:
    rw = rewrite_request(chat(**{field: 100_000}), "chat", POLICY)
    assert rw.body[field] == 16384
    assert (rw.max_tokens, rw.max_tokens_action) == (16384, "clamped")
    assert rw.max_tokens_header == "clamped; value=16384; requested=100000"


def test_both_limits_clamped_and_completion_tokens_wins() -> None:
    """Chat honours max_completion_tokens over max_tokens, as vLLM does."""
    rw = rewrite_request(chat(max_tokens=99_999, max_completion_tokens=500), "chat", POLICY)
    assert rw.body == {**rw.body, "max_tokens": 16384, "max_completion_tokens": 500}
    assert rw.max_tokens == 500
    assert rw.max_tokens_action == "clamped"


def test_reject_policy_names_the_field() -> None:
    policy = RewritePolicy(max_tokens_cap=1000, max_tokens_policy="reject")
    with pytest.raises(BadRequest) as err:
        rewrite_request(chat(max_completion_tokens=5000), "chat", policy)
    assert err.value.param == "max_completion_tokens"
    assert err.value.status == 400
    assert "1000" in err.value.message


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": "100"}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"n": 0}, "n"),
        ({"n": 1.5}, "n"),
        ({"model": 3}, "model"),
        ({"messages": "hello"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": ["hello"]}, "messages[0]"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": "y"}}, "stream_options"),
    ],
)
def test_wrong_types_are_400_naming_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as err:
        rewrite_request(chat(**fields), "chat", POLICY)
    assert err.value.param == param


@pytest.mark.parametrize("prompt", [None, 5, [], [1, "a"], [{"x": 1}]])
def test_bad_prompt_is_400(prompt: Any) -> None:
    with pytest.raises(BadRequest) as err:
        rewrite_request({"model": "m", "prompt": prompt}, "completions", POLICY)
    assert err.value.param == "prompt"


@pytest.mark.parametrize("prompt", ["text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
def test_valid_prompts_pass(prompt: Any) -> None:
    rewrite_request({"model": "m", "prompt": prompt}, "completions", POLICY)


def test_non_object_body_is_400() -> None:
    with pytest.raises(BadRequest):
        rewrite_request([1, 2], "chat", POLICY)


def test_upstream_always_streams_with_continuous_usage() -> None:
    rw = rewrite_request(chat(), "chat", POLICY)
    assert rw.body["stream"] is True
    assert rw.body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert rw.client_stream is False
    assert rw.client_wants_usage is True  # non-streaming responses always carry usage


def test_streaming_client_without_usage_does_not_want_it() -> None:
    rw = rewrite_request(chat(stream=True), "chat", POLICY)
    assert rw.client_stream is True
    assert rw.client_wants_usage is False


def test_streaming_client_usage_request_is_remembered() -> None:
    rw = rewrite_request(chat(stream=True, stream_options={"include_usage": True}), "chat", POLICY)
    assert rw.client_wants_usage is True


def test_usage_fallback_keeps_the_clients_own_options() -> None:
    """For engines that reject continuous_usage_stats, the client's request goes as it was."""
    plain = rewrite_request(chat(), "chat", POLICY, usage_options=False)
    assert "stream_options" not in plain.body
    own = {"include_usage": True}
    rw = rewrite_request(chat(stream=True, stream_options=own), "chat", POLICY, usage_options=False)
    assert rw.body["stream_options"] == own


def test_sampling_defaults_fill_only_unset_fields() -> None:
    policy = RewritePolicy(
        sampling_defaults={
            "llama-*": {"repetition_penalty": 1.1, "temperature": 0.6},
            "llama-3": {"min_p": 0.05, "repetition_penalty": 1.05},
            "qwen*": {"top_k": 20},
        }
    )
    rw = rewrite_request({**chat(temperature=0.0), "model": "llama-3"}, "chat", policy)
    assert rw.body["temperature"] == 0.0  # the client's value wins
    assert rw.body["repetition_penalty"] == 1.05  # the exact name wins over the glob
    assert rw.body["min_p"] == 0.05
    assert "top_k" not in rw.body


def test_sampling_default_values_are_copied() -> None:
    detection = {"max_pattern_size": 32, "min_count": 3}
    policy = RewritePolicy(sampling_defaults={"*": {"repetition_detection": detection}})
    rw = rewrite_request(chat(), "chat", policy)
    rw.body["repetition_detection"]["min_count"] = 99
    assert detection["min_count"] == 3


def test_fixed_language_adds_system_message() -> None:
    rw = rewrite_request(chat(), "chat", RewritePolicy(language="it"))
    assert rw.body["messages"][0] == {
        "role": "system",
        "content": "Rispondi esclusivamente in italiano. Non usare altre lingue.",
    }
    assert rw.body["messages"][1] == {"role": "user", "content": "hi"}
    assert (rw.expected_language, rw.injected_language) == ("it", "it")


def test_language_appends_to_existing_system_message_once() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    rw = rewrite_request(chat(messages=messages), "chat", RewritePolicy(language="de"))
    assert rw.body["messages"][0]["content"] == (
        "Be brief.\n\nAntworte ausschließlich auf Deutsch. Verwende keine andere Sprache."
    )
    again = rewrite_request(rw.body, "chat", RewritePolicy(language="de"))
    assert again.body["messages"][0] == rw.body["messages"][0]
    assert messages[0]["content"] == "Be brief."


ITALIAN = "Scrivi una storia lunga sul mare e sulle montagne della Sardegna, per favore."


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (ITALIAN, "it"),
        ("Écris une longue histoire sur la mer et les montagnes de Bretagne, s'il te plaît.", "fr"),
        ("Schreibe bitte eine lange Geschichte über das Meer und die Berge in Bayern.", "de"),
        ("Напиши, пожалуйста, длинную историю о море и горах Кавказа.", "ru"),
    ],
)
def test_auto_never_injects_the_language_a_prompt_is_written_in(text: str, code: str) -> None:
    """The prompt's language is a reading (identification), not a request: it is expected, but
    never told to the model; only a declared or unambiguously requested language is."""
    body = chat(messages=[{"role": "user", "content": text}])
    rw = rewrite_request(body, "chat", RewritePolicy(language="auto"))
    assert (rw.expected_language, rw.injected_language) == (code, None)
    assert rw.body["messages"] == body["messages"]


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("Rispondi in italiano: come funzionano i vaccini?", "it"),
        ("Réponds en français : comment fonctionnent les vaccins ?", "fr"),
        ("Antworte bitte auf Deutsch: Wie funktionieren Impfstoffe?", "de"),
        ("Ответь на русском языке: как работают вакцины?", "ru"),
    ],
)
def test_auto_language_instructs_in_the_users_language(text: str, code: str) -> None:
    body = chat(messages=[{"role": "user", "content": text}])
    rw = rewrite_request(body, "chat", RewritePolicy(language="auto"))
    assert rw.injected_language == code
    assert rw.body["messages"][0]["content"] == language_instruction(code)


def test_auto_language_does_not_instruct_an_english_prompt_without_a_request() -> None:
    """An English prompt that asks for no language sets a weak expectation: nothing injected."""
    text = "Write a long story about the sea and the mountains of Scotland, please."
    rw = rewrite_request(chat(messages=[{"role": "user", "content": text}]), "chat", auto())
    assert (rw.expected_language, rw.expectation.strength, rw.injected_language) == (
        "en",
        "weak",
        None,
    )
    assert rw.body["messages"] == [{"role": "user", "content": text}]


def auto() -> RewritePolicy:
    return RewritePolicy(language="auto")


def test_auto_language_reads_every_user_message_and_text_parts() -> None:
    messages = [
        {"role": "user", "content": "Write me a long story about the sea and the mountains."},
        {"role": "assistant", "content": "Sure."},
        {"role": "user", "content": [{"type": "text", "text": ITALIAN + " Rispondi in italiano."}]},
    ]
    rw = rewrite_request(chat(messages=messages), "chat", RewritePolicy(language="auto"))
    assert rw.injected_language == "it"
    plain = [*messages[:2], {"role": "user", "content": [{"type": "text", "text": ITALIAN}]}]
    rw = rewrite_request(chat(messages=plain), "chat", RewritePolicy(language="auto"))
    assert rw.injected_language is None
    assert rw.expectation.accepted == {"en", "it"}  # both turns' languages


def test_auto_language_skips_short_messages() -> None:
    rw = rewrite_request(chat(), "chat", RewritePolicy(language="auto"))
    assert rw.injected_language is None
    assert rw.body["messages"] == [{"role": "user", "content": "hi"}]


def test_completions_get_expected_language_but_no_prompt_edit() -> None:
    body = {"model": "m", "prompt": ITALIAN}
    rw = rewrite_request(body, "completions", RewritePolicy(language="auto"))
    assert rw.body["prompt"] == ITALIAN
    assert (rw.expected_language, rw.injected_language) == ("it", None)


def test_languages_without_translation_get_an_english_sentence() -> None:
    assert language_instruction("sw") == "Respond only in Swahili. Do not use any other language."
    for code in ("en", "it", "fr", "de", "es", "pt", "nl", "pl", "ru", "zh", "ja", "ko", "vi"):
        assert "Respond only" not in language_instruction(code) or code == "en"


@pytest.mark.parametrize(
    ("fields", "structured"),
    [
        ({"response_format": {"type": "json_object"}}, True),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, True),
        ({"response_format": {"type": "text"}}, False),
        ({}, False),
    ],
)
def test_structured_output_is_flagged(fields: dict[str, Any], structured: bool) -> None:
    assert rewrite_request(chat(**fields), "chat", POLICY).structured is structured


ASK_FRENCH = "Reply in French. Explain how a rainbow forms, for a curious teenager."


def test_auto_injects_the_requested_language_not_the_prompts() -> None:
    """An English prompt that asks for French gets the French instruction, never English."""
    rw = rewrite_request(chat(messages=[{"role": "user", "content": ASK_FRENCH}]), "chat",
                         RewritePolicy(language="auto"))  # fmt: skip
    assert (rw.expected_language, rw.injected_language) == ("fr", "fr")
    assert rw.body["messages"][0]["content"] == language_instruction("fr")
    assert (rw.expectation.source, rw.expectation.reason) == ("request", "instruction")


@pytest.mark.parametrize(
    ("endpoint", "body", "where"),
    [
        ("responses", {"model": "m", "input": ASK_FRENCH}, "instructions"),
        ("responses", {"model": "m", "instructions": "Always answer in German.",
                       "input": [{"role": "user", "content": "Explain how rainbows form."}]},
         "instructions"),
        ("messages", {"model": "m", "max_tokens": 50,
                      "messages": [{"role": "user", "content": ASK_FRENCH}]}, "system"),
        ("messages", {"model": "m", "max_tokens": 50, "system": [
            {"type": "text", "text": "Always answer in German."}],
            "messages": [{"role": "user", "content": "Explain how rainbows form."}]}, "system"),
    ],
)  # fmt: skip
def test_auto_reads_the_request_on_every_surface(
    endpoint: Endpoint, body: dict[str, Any], where: str
) -> None:
    rw = rewrite_request(body, endpoint, RewritePolicy(language="auto"))
    code = "de" if "German" in str(body) else "fr"
    assert (rw.expected_language, rw.injected_language, rw.expectation.source) == (
        code,
        code,
        "request",
    )
    assert language_instruction(code) in str(rw.body[where])


def test_auto_injects_nothing_when_unsure() -> None:
    """Two requested languages, or a translation without a target: no instruction at all."""
    for text in (
        "Write a short story in Spanish and then explain it in English.",
        "Translate this: il fait beau aujourd'hui et nous allons au parc.",
    ):
        body = chat(messages=[{"role": "user", "content": text}])
        rw = rewrite_request(body, "chat", RewritePolicy(language="auto"))
        assert rw.injected_language is None
        assert rw.expectation.strength != "strong"
        assert rw.body["messages"] == body["messages"]


def test_default_settings_expect_the_requested_language_without_injecting() -> None:
    """GUARD_LANGUAGE=off: the English prompt that asks for Hindi expects Hindi; an English
    prompt without a request expects English (weak); the request is not edited."""
    asked = chat(messages=[{"role": "user", "content": "Explain rainbows. Reply in Hindi."}])
    rw = rewrite_request(asked, "chat", RewritePolicy())
    assert (rw.expected_language, rw.injected_language) == ("hi", None)
    assert rw.body["messages"] == asked["messages"]
    plain = chat(messages=[{"role": "user", "content": "Explain how a rainbow forms, please."}])
    english = rewrite_request(plain, "chat", RewritePolicy()).expectation
    assert (english.code, english.strength, english.reason) == ("en", "weak", "conversation")
    short = chat(messages=[{"role": "user", "content": "什么是量子计算？"}])
    assert rewrite_request(short, "chat", RewritePolicy()).expected_language == "zh"


def test_client_language_wins_and_config_beats_the_request() -> None:
    body = chat(messages=[{"role": "user", "content": ASK_FRENCH}])
    rw = rewrite_request(body, "chat", RewritePolicy(language="auto"), language="de")
    assert (rw.expected_language, rw.injected_language, rw.expectation.reason) == (
        "de",
        "de",
        "header",
    )
    none = rewrite_request(body, "chat", RewritePolicy(language="auto"), language="none")
    assert (none.expected_language, none.injected_language) == (None, None)
    pinned = rewrite_request(body, "chat", RewritePolicy(language="it"))
    assert (pinned.expected_language, pinned.expectation.source) == ("it", "config")
    assert (
        rewrite_request(body, "chat", RewritePolicy(expect_language="off")).expected_language
        is None
    )


MARKED = "Go on with this chat:\n### Human: hi\n### Assistant: hello"
PLAIN = "Go on with this chat:\nHuman: hi\nAssistant: hello"
BODIES: list[tuple[Endpoint, Callable[[str], dict[str, Any]]]] = [
    ("chat", lambda t: {"messages": [{"role": "user", "content": t}]}),
    (
        "chat",
        lambda t: {
            "messages": [{"role": "system", "content": t}, {"role": "user", "content": "Hi"}]
        },
    ),
    ("completions", lambda t: {"prompt": t}),
    ("responses", lambda t: {"input": t}),
    ("responses", lambda t: {"instructions": t, "input": [{"role": "user", "content": "Hi"}]}),
    (
        "messages",
        lambda t: {
            "system": [{"type": "text", "text": t}],
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 16,
        },
    ),
]


@pytest.mark.parametrize(("endpoint", "body"), BODIES)
def test_a_request_that_holds_a_turn_marker_is_not_judged_for_turns(
    endpoint: Endpoint, body: Callable[[str], dict[str, Any]]
) -> None:
    """Wherever a surface carries the request's text, a marker in it tells the detector that an
    answer may write one too (proxy/detect/turns.py); the same request without the markers'
    hashes is judged."""
    marked = rewrite_request({"model": "m", **body(MARKED)}, endpoint, RewritePolicy())
    plain = rewrite_request({"model": "m", **body(PLAIN)}, endpoint, RewritePolicy())
    assert (marked.quotes_turns, plain.quotes_turns) == (True, False)
