"""Request rewriting for ``/v1/responses`` and ``/v1/messages`` (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.rewrite import RewritePolicy, rewrite_request
from proxy.errors import BadRequest

ASK = " Rispondi in italiano."
ITALIAN = (
    "Raccontami qualcosa sulla storia di Roma antica, per favore, con qualche dettaglio." + ASK
)


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        ("responses", {"model": "m"}, "input"),
        ("responses", {"model": "m", "input": 3}, "input"),
        ("responses", {"model": "m", "input": "x", "instructions": 1}, "instructions"),
        ("responses", {"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ("messages", {"model": "m", "messages": [], "max_tokens": 5}, "messages"),
        ("messages", {"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (
            "messages",
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": True},
            "max_tokens",
        ),
        (
            "messages",
            {
                "model": "m",
                "messages": [{"role": "u", "content": "x"}],
                "max_tokens": 1,
                "system": 1,
            },
            "system",
        ),
    ],
)
def test_malformed_fields_are_400s_naming_the_field(
    endpoint: Any, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(BadRequest) as info:
        rewrite_request(body, endpoint, RewritePolicy())
    assert info.value.param == param


def test_responses_limit_default_cap_and_reject() -> None:
    policy = RewritePolicy(max_tokens_default=100, max_tokens_cap=1000)
    rw = rewrite_request({"input": "x"}, "responses", policy)
    assert rw.body["max_output_tokens"] == 100 and rw.max_tokens_action == "defaulted"
    assert rw.body["stream"] is True and "stream_options" not in rw.body
    rw = rewrite_request({"input": "x", "max_output_tokens": 5000}, "responses", policy)
    assert rw.body["max_output_tokens"] == 1000 and rw.max_tokens_header.startswith("clamped")
    strict = RewritePolicy(max_tokens_cap=1000, max_tokens_policy="reject")
    with pytest.raises(BadRequest) as info:
        rewrite_request({"input": "x", "max_output_tokens": 5000}, "responses", strict)
    assert info.value.code == "max_tokens_over_cap"


def test_the_clients_dict_is_not_modified() -> None:
    body = {"input": "x", "instructions": "Be brief.", "max_output_tokens": 9}
    before = dict(body)
    rewrite_request(body, "responses", RewritePolicy(language="de"))
    assert body == before


@pytest.mark.parametrize(
    "turns",
    [
        ITALIAN,
        [{"role": "user", "content": ITALIAN}],
        [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": ITALIAN}]}],
    ],
    ids=["string", "message", "input-items"],
)
def test_responses_auto_language_reads_the_input(turns: Any) -> None:
    rw = rewrite_request({"input": turns}, "responses", RewritePolicy(language="auto"))
    assert rw.expected_language == rw.injected_language == "it"
    assert "italiano" in rw.body["instructions"]
    plain = str(turns).replace(ASK, "") if isinstance(turns, str) else None
    if plain is not None:  # the prompt's own language is expected, never injected
        rw = rewrite_request({"input": plain}, "responses", RewritePolicy(language="auto"))
        assert (rw.expected_language, rw.injected_language) == ("it", None)


def test_messages_auto_language_reads_the_last_user_turn_and_keeps_system_blocks() -> None:
    body = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": ITALIAN}]}],
        "max_tokens": 10,
        "system": [{"type": "text", "text": "Sii breve.", "cache_control": {"type": "ephemeral"}}],
    }
    rw = rewrite_request(body, "messages", RewritePolicy(language="auto"))
    assert rw.expected_language == "it"
    assert rw.body["system"][0] == body["system"][0]  # type: ignore[index]
    assert "italiano" in rw.body["system"][1]["text"]
    assert rw.body["max_tokens"] == 10 and rw.max_tokens_action is None


def test_structured_responses_are_flagged_for_the_detector() -> None:
    body = {"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}
    assert rewrite_request(body, "responses", RewritePolicy()).structured
    assert not rewrite_request({"input": "x"}, "responses", RewritePolicy()).structured
