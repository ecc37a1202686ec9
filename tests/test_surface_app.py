"""``/v1/responses`` and ``/v1/messages`` through the proxy over real sockets, driven by the
official ``openai`` and ``anthropic`` SDKs against the fake engine's recorded-shape streams."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest

from proxy.core.records import GenerationRecord
from proxy.observability.metrics import Metrics
from tests.conftest import Clients
from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD

ProxyFactory = Callable[..., str]
HEALTHY = "The capital of France is Paris, a city on the Seine with many old bridges."
LOOP = "The answer is the answer. " * 300
USER = [{"role": "user", "content": "Tell me something about Paris, please."}]


class Recorder(Metrics):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[GenerationRecord] = []

    def record_generation(self, record: GenerationRecord) -> None:
        self.records.append(record)
        super().record_generation(record)


def _wait(predicate: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + HANG_GUARD
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def assert_upstream_closed(fake: FakeVLLM) -> None:
    rec = fake.guarded_requests()[-1]
    assert fake.wait_for(lambda: rec.disconnected is not None)
    assert not rec.completed


# ---------------------------------------------------------------- byte identity
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"model": "m", "input": "Hi", "max_output_tokens": 100}),
        ("/v1/messages", {"model": "m", "messages": USER, "max_tokens": 100}),
    ],
)
def test_healthy_stream_is_byte_identical_to_the_engines(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, path: str, body: dict[str, Any]
) -> None:
    fake_upstream.script = Script(texts=[HEALTHY], reasoning="Paris is the capital.")
    base = proxy_server()
    body = {**body, "stream": True}
    via_proxy = httpx.post(base + path, json=body)
    direct = httpx.post(fake_upstream.url + path, json=body)
    assert via_proxy.status_code == 200
    assert via_proxy.content == direct.content
    assert via_proxy.headers["content-type"] == "text/event-stream; charset=utf-8"


# ---------------------------------------------------------------- Responses
def test_responses_sdk_stream_healthy(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    fake_upstream.script = Script(texts=[HEALTHY])
    client = sdk.openai(proxy_server())
    with client.responses.stream(model="m", input="Tell me about Paris.") as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.output_text == HEALTHY
    assert final.status == "completed"
    sent = fake_upstream.guarded_requests()[0].json
    assert sent["max_output_tokens"] == 8192 and sent["stream"] is True


def test_responses_sdk_stream_loop_is_cut_and_ends_normally(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    """The SDK's stream helper ends on the guard's ``response.completed`` (status
    ``incomplete``, as vLLM ends a response it stopped early: the helper raises on a
    ``response.incomplete`` event); the reason and the guard object are on the final response;
    the engine's connection was closed mid-generation."""
    fake_upstream.script = Script(texts=["Fine start. " + LOOP], chunk_delay=0.001)
    client = sdk.openai(proxy_server())
    with client.responses.stream(model="m", input="Tell me.") as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.type for e in events[-4:]] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert final.status == "incomplete"
    assert final.incomplete_details is not None
    assert final.incomplete_details.reason == "content_filter"
    guard = (final.incomplete_details.model_extra or {})["guard"]
    assert guard["action"] == "aborted"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert final.output_text == deltas
    assert_upstream_closed(fake_upstream)


def test_responses_sdk_non_stream_healthy_and_looping(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    client = sdk.openai(proxy_server())
    fake_upstream.script = Script(texts=[HEALTHY])
    healthy = client.responses.create(model="m", input="Tell me about Paris.")
    assert healthy.output_text == HEALTHY and healthy.status == "completed"
    assert healthy.usage is not None and healthy.usage.output_tokens > 0

    fake_upstream.script = Script(texts=["Fine start. " + LOOP], chunk_delay=0.001)
    cut = client.responses.create(model="m", input="Tell me.")
    assert cut.status == "incomplete"
    assert cut.incomplete_details is not None
    guard = (cut.incomplete_details.model_extra or {})["guard"]
    assert cut.output_text == ("Fine start. " + LOOP)[: guard["onset_char"]]
    assert fake_upstream.guarded_requests()[-1].json["stream"] is True
    assert_upstream_closed(fake_upstream)


def test_responses_rewriting(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    """Default and cap of ``max_output_tokens``, the language constraint in ``instructions``,
    sampling defaults only for fields the route passes to the engine."""
    fake_upstream.script = Script(texts=[HEALTHY])
    base = proxy_server(
        language="it",
        max_tokens_cap=500,
        sampling_defaults={"*": {"temperature": 0.3, "repetition_detection": {"x": 1}}},
    )
    client = sdk.openai(base)
    client.responses.create(model="m", input="Ciao", instructions="Be brief.")
    client.responses.create(model="m", input="Ciao", max_output_tokens=100000)
    first, second = (r.json for r in fake_upstream.guarded_requests())
    assert first["max_output_tokens"] == 500
    assert first["instructions"].startswith("Be brief.\n\n")
    assert "italiano" in first["instructions"]
    assert first["temperature"] == 0.3 and "repetition_detection" not in first
    assert second["max_output_tokens"] == 500


# ---------------------------------------------------------------- Messages
def test_messages_sdk_stream_healthy(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    fake_upstream.script = Script(texts=[HEALTHY])
    client = sdk.anthropic(proxy_server())
    with client.messages.stream(model="m", messages=USER, max_tokens=200) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == HEALTHY
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0


def test_messages_sdk_stream_loop_is_cut_and_ends_normally(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    fake_upstream.script = Script(texts=["Fine start. " + LOOP], chunk_delay=0.001)
    client = sdk.anthropic(proxy_server())
    with client.messages.stream(model="m", messages=USER, max_tokens=4000) as stream:  # type: ignore[arg-type]
        events = list(stream)
        final = stream.get_final_message()
    assert final.stop_reason == "refusal"
    assert final.stop_details is not None
    assert final.stop_details.explanation is not None
    assert final.stop_details.explanation.startswith("coherence_guard:")
    [delta] = [e for e in events if e.type == "message_delta"]
    assert (delta.delta.model_extra or {})["guard"]["action"] == "aborted"
    assert events[-1].type == "message_stop"
    assert final.content[0].type == "text"
    assert final.content[0].text.startswith("Fine start. The answer")
    assert_upstream_closed(fake_upstream)


def test_messages_sdk_create_healthy_and_looping(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    client = sdk.anthropic(proxy_server())
    fake_upstream.script = Script(texts=[HEALTHY])
    healthy = client.messages.create(model="m", messages=USER, max_tokens=200)  # type: ignore[arg-type]
    direct = httpx.post(
        fake_upstream.url + "/v1/messages", json={"model": "m", "messages": USER, "max_tokens": 200}
    ).json()
    assert healthy.model_dump(exclude_none=True) == direct
    fake_upstream.script = Script(texts=["Fine start. " + LOOP], chunk_delay=0.001)
    cut = client.messages.create(model="m", messages=USER, max_tokens=4000)  # type: ignore[arg-type]
    guard = (cut.model_extra or {})["guard"]
    assert cut.stop_reason == "refusal"
    assert cut.content[0].text == ("Fine start. " + LOOP)[: guard["onset_char"]]  # type: ignore[union-attr]
    assert_upstream_closed(fake_upstream)


def test_messages_rewriting(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    """Only the cap on ``max_tokens`` (required by the API); the language constraint in
    ``system`` as a string or a block list; sampling defaults that Messages forwards."""
    fake_upstream.script = Script(texts=[HEALTHY])
    base = proxy_server(
        language="it",
        max_tokens_cap=500,
        sampling_defaults={"*": {"top_k": 20, "repetition_penalty": 1.1}},
    )
    client = sdk.anthropic(base)
    client.messages.create(model="m", messages=USER, max_tokens=100000, system="Be brief.")  # type: ignore[arg-type]
    client.messages.create(
        model="m",
        messages=USER,  # type: ignore[arg-type]
        max_tokens=100,
        system=[{"type": "text", "text": "Be brief."}],
    )
    first, second = (r.json for r in fake_upstream.guarded_requests())
    assert first["max_tokens"] == 500
    assert first["system"].startswith("Be brief.\n\n") and "italiano" in first["system"]
    assert first["top_k"] == 20 and "repetition_penalty" not in first
    assert second["max_tokens"] == 100
    assert second["system"][0] == {"type": "text", "text": "Be brief."}
    assert "italiano" in second["system"][1]["text"]
    missing = httpx.post(base + "/v1/messages", json={"model": "m", "messages": USER})
    assert missing.status_code == 400 and "max_tokens" in missing.text


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_client_hang_up_closes_the_upstream(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, endpoint: str
) -> None:
    fake_upstream.script = Script(texts=[HEALTHY * 20], chunk_delay=0.01)
    base = proxy_server()
    body: dict[str, Any] = {"model": "m", "stream": True}
    if endpoint == "responses":
        body.update(input="x")
    else:
        body.update(messages=USER, max_tokens=4000)
    with httpx.stream("POST", f"{base}/v1/{endpoint}", json=body) as r:
        for _ in zip(range(5), r.iter_raw(), strict=False):
            pass
        gone = time.monotonic()
    rec = fake_upstream.guarded_requests()[0]
    assert fake_upstream.wait_for(lambda: rec.disconnected is not None)
    assert rec.disconnected is not None and rec.disconnected - gone < 0.2
    assert not rec.completed


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_engine_error_mid_stream_is_an_error_answer_for_a_non_streaming_client(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients, endpoint: str
) -> None:
    fake_upstream.script = Script(texts=[HEALTHY], mid_stream_error=3)
    base = proxy_server()
    if endpoint == "responses":
        with pytest.raises(openai.APIStatusError) as oa_info:
            sdk.openai(base).responses.create(model="m", input="x")
        assert oa_info.value.status_code == 502
    else:
        with pytest.raises(anthropic.APIStatusError) as an_info:
            sdk.anthropic(base).messages.create(model="m", messages=USER, max_tokens=50)  # type: ignore[arg-type]
        assert an_info.value.status_code == 502
        assert "engine failure" in str(an_info.value)


# ---------------------------------------------------------------- records and metrics
@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_generations_are_recorded_with_the_route(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, endpoint: str
) -> None:
    fake_upstream.script = Script(texts=["Fine start. " + LOOP], chunk_delay=0.001)
    metrics = Recorder()
    base = proxy_server(metrics=metrics)
    body: dict[str, Any] = {"model": "m", "stream": True}
    if endpoint == "responses":
        body["input"] = "Tell me."
    else:
        body.update(messages=USER, max_tokens=4000)
    httpx.post(f"{base}/v1/{endpoint}", json=body)
    assert _wait(lambda: bool(metrics.records))
    [record] = metrics.records
    assert (record.endpoint, record.outcome) == (endpoint, "aborted")
    [choice] = record.choices
    assert choice.detection_action == "aborted" and choice.finish_reason == "content_filter"
    quality = httpx.get(base + "/metrics/quality").text
    assert f'endpoint="{endpoint}",model="m",outcome="aborted"' in quality


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_off_mode_relays_the_engines_answer(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, endpoint: str
) -> None:
    fake_upstream.script = Script(texts=["Fine start. " + LOOP])
    base = proxy_server(mode="off")
    body: dict[str, Any] = {"model": "m", "stream": True}
    if endpoint == "responses":
        body.update(input="x", max_output_tokens=4000)
    else:
        body.update(messages=USER, max_tokens=4000)
    via_proxy = httpx.post(f"{base}/v1/{endpoint}", json=body)
    direct = httpx.post(f"{fake_upstream.url}/v1/{endpoint}", json=body)
    assert via_proxy.content == direct.content
