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
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from anthropic.types import RawMessageStreamEvent
from openai.types.responses import Response, ResponseCompletedEvent, ResponseStreamEvent
from pydantic import TypeAdapter

from proxy.core.guard import GuardPolicy, StreamGuard
from proxy.core.surfaces import via_chat
from proxy.detect import Detector
from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD
from tests.sdk_warmup import warm_sdk_stream_types
from tests.test_surface_heal import chat_stream

ProxyFactory = Callable[..., str]
EARLY_STOP = Path(__file__).parent / "data" / "early_stop"
SURFACES = Path(__file__).parent / "streams" / "surfaces"
LOOP = "Fine start. " + "The answer is the answer. " * 120
LIFECYCLE = {"response.created", "response.in_progress", "response.completed"}
STREAMS = 16


def one_stream(base: str, n: int, mode: str) -> tuple[str, set[str], list[int], Any]:
    """(the id this client's request named, the ids its lifecycle events carried, their
    sequence numbers, the final response)."""
    own = f"resp_client{n}"
    client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=HANG_GUARD)
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
    warm_sdk_stream_types()  # the SDK's lazy types are not built thread-safely (sdk_warmup.py)
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


# ---------------------------------------------------------------- the SDK's own types
# Why the shape matters for the identity check: openai 3.57 validates each event strictly
# against its types and, when that fails, builds it loosely through a discriminator map that it
# computes lazily and not thread-safely — under concurrent first use the map comes out partial,
# a ``response.completed`` event is then built as the union's first variant with its response
# left a plain dict, and the stream helper reads its id as None ("Lifecycle response identity
# changed."). The engine's own events validate; the proxy's endings must too.


def engine_usage() -> dict[str, Any]:
    usage: dict[str, Any] = orjson.loads((EARLY_STOP / "responses.json").read_bytes())["usage"]
    return usage


def assert_engine_usage_shape(usage: dict[str, Any]) -> None:
    engine = engine_usage()
    assert set(usage) == set(engine)
    for key in ("input_tokens_details", "output_tokens_details"):
        assert set(usage[key]) == set(engine[key]), key


@pytest.mark.parametrize("counted", [19, None], ids=["counted", "uncounted"])
def test_an_aborted_stream_ends_with_a_response_the_sdk_validates(counted: int | None) -> None:
    """vLLM writes its usage only on the terminal event: the ending waits for the shell's count
    of the prompt. With it, the usage has the engine's shape; without it, ``usage`` is null
    (a usage without its input count would fail the SDK's validation)."""
    g = StreamGuard(GuardPolicy.create(endpoint="responses", hold_ending=True), Detector)
    raw = g.feed((SURFACES / "responses_vllm_loop.sse").read_bytes())
    assert g.aborted and g.prompt_uncounted and g.held is not None
    if counted is not None:
        g.counted(counted)
    raw += g.release()
    last = raw.rsplit(b"\n\n", 2)[-2]
    event = orjson.loads(last.partition(b"\ndata: ")[2])
    assert event["type"] == "response.completed"
    ResponseCompletedEvent.model_validate(event)  # raises on a field the SDK requires
    usage = event["response"]["usage"]
    if counted is None:
        assert usage is None
    else:
        assert_engine_usage_shape(usage)
        assert usage["input_tokens"] == counted


@pytest.mark.parametrize("counted", [19, None], ids=["counted", "uncounted"])
def test_an_aborted_answer_is_a_response_the_sdk_validates(counted: int | None) -> None:
    g = StreamGuard(GuardPolicy.create(endpoint="responses", collect=True), Detector)
    g.feed((SURFACES / "responses_vllm_loop.sse").read_bytes())
    assert g.prompt_uncounted
    if counted is not None:
        g.counted(counted)
    answer = g.response(trim=True)
    Response.model_validate(answer)
    if counted is None:
        assert answer["usage"] is None
    else:
        assert_engine_usage_shape(answer["usage"])


@pytest.mark.parametrize(
    ("finish", "guard"),
    [
        ("content_filter", {"action": "aborted", "signal": "repetition", "onset_char": 3}),
        ("stop", {"action": "healed", "signal": "repetition", "attempts": 1}),
        ("length", None),
    ],
    ids=["aborted", "healed", "length"],
)
def test_heal_through_chat_ends_with_a_response_the_sdk_validates(
    finish: str, guard: dict[str, Any] | None
) -> None:
    raw = chat_stream(["Once ", "upon ", "a time."], finish=finish, guard=guard)
    out = via_chat.writer("responses", {"model": "m"}, "content_filter").stream(raw)
    event = orjson.loads(out.rsplit(b"\n\n", 2)[-2].partition(b"\ndata: ")[2])
    assert event["type"] == "response.completed"
    ResponseCompletedEvent.model_validate(event)
    assert_engine_usage_shape(event["response"]["usage"])
    answer = {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "created": 5,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Once upon a time."},
                "finish_reason": finish,
                **({"guard": guard} if guard else {}),
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
    }
    whole = via_chat.writer("responses", {"model": "m"}, "content_filter")
    body = orjson.loads(whole.answer(200, orjson.dumps(answer)))
    Response.model_validate(body)
    assert_engine_usage_shape(body["usage"])


def every_event(raw: bytes) -> list[dict[str, Any]]:
    return [
        orjson.loads(block.partition(b"data: ")[2]) for block in raw.split(b"\n\n") if block.strip()
    ]


@pytest.mark.parametrize("surface", ["responses", "messages"])
def test_every_event_of_an_abort_and_of_heal_validates_against_the_sdks_types(
    surface: str,
) -> None:
    """All events the proxy writes itself, not only the terminal one: the anthropic SDK builds
    events the same way as openai's."""
    adapter: TypeAdapter[Any] = TypeAdapter(
        ResponseStreamEvent if surface == "responses" else RawMessageStreamEvent
    )
    g = StreamGuard(GuardPolicy.create(endpoint=surface), Detector)
    streams = [g.feed((SURFACES / f"{surface}_vllm_loop.sse").read_bytes())]
    assert g.aborted
    for finish, guard in [
        ("content_filter", {"action": "aborted", "signal": "repetition", "onset_char": 3}),
        ("stop", {"action": "healed", "signal": "repetition", "attempts": 1}),
        ("length", None),
        ("stop", None),
    ]:
        raw = chat_stream(["Once ", "upon ", "a time."], finish=finish, guard=guard)
        streams.append(via_chat.writer(surface, {"model": "m"}, "content_filter").stream(raw))
    for raw in streams:
        for event in every_event(raw):
            adapter.validate_python(event)
