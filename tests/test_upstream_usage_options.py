"""The usage-options fallback: only an engine's specific rejection of the fields the proxy adds
turns them off, only for a while, and the metric shows it."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import orjson
import pytest

from proxy.server.usage_options import UsageOptions, names_usage_option
from tests.fakes.vllm import FakeVLLM, Script

ProxyFactory = Callable[..., str]
CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]


def j(doc: object) -> bytes:
    return orjson.dumps(doc)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (
            400,
            j(
                {
                    "error": {
                        "message": "Unrecognized request argument supplied: stream_options",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": None,
                    }
                }
            ),
        ),
        (
            400,
            j(
                {
                    "object": "error",
                    "message": "Unrecognized request argument supplied: stream_options",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            ),
        ),
        (
            400,
            j(
                {
                    "error": {
                        "message": "Extra inputs are not permitted, field: "
                        "'stream_options.continuous_usage_stats', value: True",
                        "type": "invalid_request_error",
                    }
                }
            ),
        ),
        (400, j({"error": {"message": "bad", "param": "stream_options.continuous_usage_stats"}})),
        (
            422,
            j(
                {
                    "detail": [
                        {
                            "type": "extra_forbidden",
                            "loc": ["body", "stream_options", "continuous_usage_stats"],
                            "msg": "Extra inputs are not permitted",
                            "input": True,
                        }
                    ]
                }
            ),
        ),
    ],
    ids=["openai", "vllm-legacy", "pydantic-400", "param", "fastapi-422"],
)
def test_a_rejection_naming_the_added_fields_is_recognised(status: int, body: bytes) -> None:
    assert names_usage_option(status, body)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        # The word appears, but the error is about something else (here: the prompt quoted).
        (
            400,
            j(
                {
                    "error": {
                        "message": "This model's maximum context length is 2048 tokens. "
                        "Prompt: 'explain stream_options'",
                        "param": None,
                    }
                }
            ),
        ),
        (400, b"stream_options unrecognized (not JSON)"),
        (500, j({"error": {"message": "Unrecognized request argument: stream_options"}})),
        (422, j({"detail": [{"loc": ["body", "messages"], "msg": "Field required"}]})),
        (400, j({"error": {"message": "max_tokens must be at least 1", "param": "max_tokens"}})),
        (400, j(["stream_options"])),
    ],
    ids=["prompt-quoted", "not-json", "500", "other-field-422", "other-field-400", "json-list"],
)
def test_other_errors_are_not_taken_for_a_rejection(status: int, body: bytes) -> None:
    assert not names_usage_option(status, body)


def test_fallback_lasts_retry_after_then_probes_again() -> None:
    now = [1000.0]
    changes: list[bool] = []
    usage = UsageOptions(retry_after=600, clock=lambda: now[0], on_change=changes.append)
    assert usage.wanted() and not usage.fallback
    usage.rejected()
    usage.rejected()  # concurrent requests rejected together: one change
    assert changes == [True]
    now[0] += 599.9
    assert not usage.wanted()
    now[0] += 0.1
    assert usage.wanted(), "after retry_after the next request probes with the options"
    assert changes == [True, False]
    usage.rejected()
    assert not usage.wanted() and changes == [True, False, True]


def _fallback_gauge(base: str) -> float | None:
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.startswith("guard_proxy_usage_options_fallback "):
            return float(line.split()[1])
    return None


def test_specific_rejection_falls_back_and_the_metric_shows_it(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server()
    assert _fallback_gauge(base) == 0
    fake_upstream.script = Script(texts=["Hello world."], reject_stream_options=True)
    r = httpx.post(base + CHAT, json={"model": "m", "messages": MESSAGES})
    assert r.json()["choices"][0]["message"]["content"] == "Hello world."
    first, retry = fake_upstream.guarded_requests()
    assert "stream_options" in first.json and "stream_options" not in retry.json
    assert _fallback_gauge(base) == 1


def test_an_unrelated_400_is_relayed_and_changes_nothing(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """A 400 whose body merely contains the words (the old rule) is the engine's answer to the
    client; exact token counting stays on."""
    base = proxy_server()
    body = j(
        {
            "error": {
                "message": "Prompt too long: 'what are stream_options and continuous_usage_stats'",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        }
    )
    fake_upstream.scripts = [Script(status=400, error_body=body)]
    r = httpx.post(base + CHAT, json={"model": "m", "messages": MESSAGES})
    assert r.status_code == 400
    assert len(fake_upstream.guarded_requests()) == 1, "no retry"
    r = httpx.post(base + CHAT, json={"model": "m", "messages": MESSAGES})
    assert r.status_code == 200
    assert "stream_options" in fake_upstream.last.json
    assert _fallback_gauge(base) == 0
