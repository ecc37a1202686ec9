"""Build the SDKs' stream types once, on one thread, before tests read streams from many.

Why: the openai and anthropic SDKs build their pydantic models lazily, and pydantic's deferred
schema build is not thread-safe. When many threads read their first streams at once, one of them can
find a model's schema half-built and raise ``PydanticUserError`` ("BaseModel cannot be instantiated
directly") from inside the SDK's stream helper, or build an event as the wrong class
(``bench/measure/clients/sdk_lifecycle_race.py``). That happens without the proxy too, and it says
nothing about the proxy; the tests that run clients side by side are there to check what the proxy
sends each of them. So they first replay recorded streams — the engine's and the guard's abort of
them — through the same SDK calls, over an in-process transport, on the test's thread.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import orjson
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


def stream_client(
    body: bytes, content_type: str = "text/event-stream", *, lib: ModuleType = httpx
) -> Any:
    """An HTTP client whose every request is answered 200 with ``body``, in process. ``lib`` is
    httpx for the openai SDK, httpx2 (its successor package) for the anthropic SDK, which
    refuses the other; both have the same API."""

    def answer(request: Any) -> Any:
        return lib.Response(200, headers={"content-type": content_type}, content=body)

    return lib.Client(transport=lib.MockTransport(answer))


def openai_client(http: httpx.Client) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://sdk.invalid/v1", api_key="k", http_client=http)


def warm_sdk_stream_types() -> None:
    """Read each recorded stream with the openai and anthropic SDKs' stream helpers."""
    for body in recorded_streams("responses"):
        with stream_client(body) as http:
            client = openai_client(http)
            with client.responses.stream(model="m", input="hi") as stream:
                for _ in stream:
                    pass
                stream.get_final_response()
    for body in recorded_streams("chat"):
        with stream_client(body) as http:
            client = openai_client(http)
            chunks = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            for _ in chunks:
                pass
    for body in recorded_streams("messages"):
        with stream_client(body, lib=httpx2) as http:
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

    with stream_client(orjson.dumps(answer), "application/json") as http:
        client = openai_client(http)
        parsed = client.chat.completions.parse(
            model="m", messages=[{"role": "user", "content": "hi"}], response_format=type(example)
        )
        assert parsed.choices[0].message.parsed == example
