"""Build the SDKs' stream types once, on one thread, before tests read streams from many.

Why: the openai and anthropic SDKs build their pydantic models lazily, and pydantic's deferred
schema build is not thread-safe. When many threads read their first streams at once, one of
them can find a model's schema half-built and raise ``PydanticUserError`` ("BaseModel cannot be
instantiated directly") from inside the SDK's stream helper, or build an event as the wrong
class (``bench/sdk_lifecycle_race.py``). That happens without the proxy too, and it says nothing
about the proxy; the tests that run clients side by side are there to check what the proxy
sends each of them. So they first replay recorded streams — the engine's and the guard's
abort of them — through the same SDK calls, over an in-process transport, on the test's
thread.
"""

from __future__ import annotations

from pathlib import Path

import anthropic
import httpx
import httpx2
import openai
from pydantic import BaseModel

from proxy.core.guard import GuardPolicy, StreamGuard
from proxy.detect import Detector

STREAMS = Path(__file__).parent / "streams"


def recorded_streams(surface: str) -> list[bytes]:
    """The engine's own stream of a loop and the guard's abort of it, for ``surface``."""
    if surface == "chat":
        loop = (STREAMS / "chat_usage.sse").read_bytes()
    else:
        loop = (STREAMS / "surfaces" / f"{surface}_vllm_loop.sse").read_bytes()
    guard = StreamGuard(GuardPolicy.create(endpoint=surface), Detector)
    return [loop, guard.feed(loop)]


def stream_client(body: bytes) -> httpx.Client:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return httpx.Client(transport=httpx.MockTransport(answer))


def stream_client2(body: bytes) -> httpx2.Client:
    """The same for the anthropic SDK, which is built on httpx's successor package."""

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return httpx2.Client(transport=httpx2.MockTransport(answer))


def warm_sdk_stream_types() -> None:
    """Read each recorded stream with the openai and anthropic SDKs' stream helpers."""
    for body in recorded_streams("responses"):
        with stream_client(body) as http:
            client = openai.OpenAI(base_url="http://sdk.invalid/v1", api_key="k", http_client=http)
            with client.responses.stream(model="m", input="hi") as stream:
                for _ in stream:
                    pass
                stream.get_final_response()
    for body in recorded_streams("chat"):
        with stream_client(body) as http:
            client = openai.OpenAI(base_url="http://sdk.invalid/v1", api_key="k", http_client=http)
            chunks = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            for _ in chunks:
                pass
    for body in recorded_streams("messages"):
        with stream_client2(body) as http:
            messages = anthropic.Anthropic(
                base_url="http://sdk.invalid", api_key="k", http_client=http
            ).messages
            with messages.stream(
                model="m", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
            ) as events:
                for _ in events:
                    pass
                events.get_final_message()


def warm_openai_parse(example: BaseModel) -> None:
    """Parse one answer of ``example``'s type with ``chat.completions.parse``.

    The SDK makes ``ParsedChatCompletion[T]`` and its parts for each ``T`` on first use, the
    same lazy way; structured-output clients (langchain's ``with_structured_output`` included)
    go through it.
    """
    answer = {
        "id": "chatcmpl-warm",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": example.model_dump_json()},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }

    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=answer)

    with httpx.Client(transport=httpx.MockTransport(reply)) as http:
        client = openai.OpenAI(base_url="http://sdk.invalid/v1", api_key="k", http_client=http)
        parsed = client.chat.completions.parse(
            model="m", messages=[{"role": "user", "content": "hi"}], response_format=type(example)
        )
        assert parsed.choices[0].message.parsed == example
