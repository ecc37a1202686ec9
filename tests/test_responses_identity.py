"""One response per Responses stream, side by side: every lifecycle event a client gets carries
the id of its own response, and the openai SDK's stream helper (which raises "Lifecycle response
identity changed." otherwise) returns that response.

Why: the client matrix (``tests/e2e/test_client_aborts.py``) saw that error from openai 3.57's
``responses.stream()`` while fifteen clients ran at once. What the proxy could do to cause it —
relay a second response's events into a stream, or end an aborted or healed stream with a
response object of another id — is checked here with many streams at once through the real
proxy (uvicorn), the official SDK, and the fake vLLM making one id per request as vLLM does
(Responses: the body's ``request_id``; chat: ``chatcmpl-<X-Request-Id>``). Each stream loops,
so each is cut: by enforce's ending on the native route, and by heal's (attempts, then the
abort) through the chat route.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from tests.fakes.vllm import FakeVLLM, Script

ProxyFactory = Callable[..., str]
LOOP = "Fine start. " + "The answer is the answer. " * 120
LIFECYCLE = {"response.created", "response.in_progress", "response.completed"}
STREAMS = 16


def one_stream(base: str, n: int, mode: str) -> tuple[str, set[str], list[int], Any]:
    """(the id this client's request named, the ids its lifecycle events carried, their
    sequence numbers, the final response)."""
    own = f"resp_client{n}"
    client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=30)
    try:
        if mode == "enforce":  # the native route: vLLM names the response after request_id
            extra: dict[str, Any] = {"extra_body": {"request_id": own}}
        else:  # heal goes through the chat route: vLLM names it after X-Request-Id
            extra = {"extra_headers": {"x-request-id": f"client{n}"}}
        seen: set[str] = set()
        seqs: list[int] = []
        with client.responses.stream(
            model="m", input=f"Tell me a story, {n}.", max_output_tokens=400, **extra
        ) as stream:
            for event in stream:
                seqs.append(event.sequence_number)
                if event.type in LIFECYCLE:
                    seen.add(event.response.id)
            final = stream.get_final_response()
        return own, seen, seqs, final
    finally:
        client.close()


@pytest.mark.parametrize("mode", ["enforce", "heal"])
def test_side_by_side_streams_each_carry_only_their_own_response(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, mode: str
) -> None:
    fake_upstream.script = Script(texts=[LOOP], chunk_delay=0.002, ids_from_request=True)
    base = proxy_server(mode=mode)
    with ThreadPoolExecutor(STREAMS) as pool:
        results = list(pool.map(lambda n: one_stream(base, n, mode), range(STREAMS)))
    for own, seen, seqs, final in results:
        assert seen == {own}, (own, seen)
        assert final.id == own
        assert seqs == list(range(len(seqs))), own  # one stream's numbering, none missing
        assert final.status == "incomplete"
        guard = (final.incomplete_details.model_extra or {})["guard"]
        assert guard["action"] == "aborted"
    sent = fake_upstream.guarded_requests()
    if mode == "enforce":
        assert sorted(r.json["request_id"] for r in sent) == sorted(r[0] for r in results)
    else:  # each stream's loop was cut and continued (same X-Request-Id) before the abort
        assert {r.path for r in sent} == {"/v1/chat/completions"}
        assert len(sent) > STREAMS
