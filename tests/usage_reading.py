"""Reading the usage of an answer as a client gets it, on every surface, streamed or not
(``tests/test_prompt_count.py`` against a test engine, ``tests/e2e/test_usage.py`` against real
ones): raw JSON, so a field left out is seen as left out."""

from __future__ import annotations

from typing import Any

from tests.test_channels import events

__all__ = ["events", "prompt_count", "usage_of"]


def usage_of(surface: str, stream: bool, got: Any) -> tuple[dict[str, Any] | None, bool]:
    """(the answer's usage, whether the guard cut it) from its JSON (not streamed) or its
    events (streamed, :func:`events`)."""
    if not stream:
        if surface in ("chat", "completions"):
            cut = got["choices"][0]["finish_reason"] == "content_filter"
        elif surface == "responses":
            cut = (got.get("incomplete_details") or {}).get("reason") == "content_filter"
        else:
            cut = got["stop_reason"] == "refusal"
        return got["usage"], cut
    if surface in ("chat", "completions"):
        finish = [c["finish_reason"] for e in got for c in e.get("choices", [])]
        [usage] = [e["usage"] for e in got if e.get("choices") == [] and e.get("usage")]
        return usage, "content_filter" in finish
    if surface == "responses":
        assert got[-1]["type"] == "response.completed"
        response = got[-1]["response"]
        reason = (response.get("incomplete_details") or {}).get("reason")
        return response["usage"], reason == "content_filter"
    [delta] = [e for e in got if e["type"] == "message_delta"]
    return delta["usage"], delta["delta"]["stop_reason"] == "refusal"


def prompt_count(surface: str, usage: dict[str, Any] | None) -> int | None:
    """The prompt count a usage reports (Messages: with the cached part, which llama.cpp counts
    apart), after checking that the totals agree with it; ``None`` where it is left out."""
    if usage is None:
        return None
    if surface in ("chat", "completions"):
        if "prompt_tokens" not in usage:
            assert "total_tokens" not in usage, usage
            return None
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        return int(usage["prompt_tokens"])
    if "input_tokens" not in usage:
        return None
    if surface == "responses":
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        return int(usage["input_tokens"])
    return int(usage["input_tokens"]) + int(usage.get("cache_read_input_tokens") or 0)
