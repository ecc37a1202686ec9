"""Defaults that fit the engine: the model's context learned, vLLM's context-length 400s read,
no default above the context sent, and one retry without the default when the engine refuses it.
The pure parts first, then a real proxy (uvicorn) in front of the fake vLLM, which refuses a
limit that does not fit with vLLM's own messages (``tests/fakes/vllm.py``, ``context_refusal``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from proxy.core.rewrite import RewritePolicy, rewrite_request
from proxy.core.surfaces import via_chat
from proxy.observability.metrics import Metrics
from proxy.server.engine_context import (
    RETRY_AFTER,
    ContextError,
    EngineContexts,
    context_error,
    model_contexts,
    model_owner,
)
from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD

ProxyFactory = Callable[..., str]
POLICY = RewritePolicy(max_tokens_default=8192, max_tokens_cap=32768)
MESSAGES = [{"role": "user", "content": "hi"}]


def _error(message: str) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
    )


# ------------------------------------------------------------------------- pure: the 400s


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        # vLLM 0.32 (vllm/renderers/params.py), as the real engine answers (tests/e2e).
        (
            "max_tokens=8192 cannot be greater than max_model_len=4096. "
            "Please request fewer output tokens.",
            ContextError(4096),
        ),
        (
            "max_completion_tokens=9000 cannot be greater than max_model_len=2048. "
            "Please request fewer output tokens.",
            ContextError(2048),
        ),
        (
            "max_output_tokens=8192 cannot be greater than max_model_len=4096. "
            "Please request fewer output tokens.",
            ContextError(4096),
        ),
        # vLLM ~0.9-0.10 (serving_engine._validate_input).
        (
            "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum "
            "context length is 4096 tokens and your request has 2778 input tokens "
            "(8000 > 4096 - 2778). None",
            ContextError(4096, 2778),
        ),
        # Older vLLM, OpenAI's own wording.
        (
            "This model's maximum context length is 4096 tokens. However, you requested 10778 "
            "tokens (2778 in the messages, 8000 in the completion). Please reduce the length of "
            "the messages or completion.",
            ContextError(4096, 2778),
        ),
    ],
    ids=["0.32-max_tokens", "0.32-max_completion_tokens", "0.32-responses", "0.10", "old"],
)
def test_context_refusals_are_read(message: str, expected: ContextError) -> None:
    """Each wording gives the context (and the prompt's tokens where it says them)."""
    assert context_error(400, _error(message)) == expected


def test_allowed_is_what_is_left_of_the_context() -> None:
    assert ContextError(4096).allowed == 4096
    assert ContextError(4096, 96).allowed == 4000


@pytest.mark.parametrize(
    ("status", "body"),
    [
        # A prompt too long even without output: no limit fits, the engine's answer stands.
        (
            400,
            _error(
                "This model's maximum context length is 4096 tokens. However, your prompt "
                "contains 5000 input tokens, which exceeds this limit even without any output "
                "tokens. Please reduce the length of the input prompt."
            ),
        ),
        (
            400,
            _error(
                "This model's maximum context length is 4096 tokens. However, you requested "
                "9000 tokens (4200 in the messages, 4800 in the completion)."
            ),
        ),
        (400, _error("truncate_prompt_tokens=9000 cannot be greater than max_model_len = 4096.")),
        (400, _error("Prompt: 'max_tokens=8 cannot be greater than max_model_len' quoted")),
        (422, _error("max_tokens=8192 cannot be greater than max_model_len=4096.")),
        (400, b"not json"),
        (400, b"[1, 2]"),
        (400, b'{"detail": "max_tokens=8192 cannot be greater than max_model_len=4096"}'),
    ],
    ids=["prompt-too-long", "prompt-over", "truncation", "quoted", "422", "text", "list", "detail"],
)
def test_other_errors_are_not_context_refusals(status: int, body: bytes) -> None:
    assert context_error(status, body) is None


def test_the_older_top_level_error_shape_is_read() -> None:
    body = orjson.dumps(
        {
            "object": "error",
            "message": "max_tokens=8192 cannot be greater than max_model_len=4096.",
            "code": 400,
        }
    )
    assert context_error(400, body) == ContextError(4096)


def test_model_contexts_reads_vllm_and_skips_engines_without_one() -> None:
    vllm = {
        "object": "list",
        "data": [
            {"id": "SmolLM2-135M-Instruct", "object": "model", "max_model_len": 4096},
            {"id": "lora-a", "object": "model", "parent": "SmolLM2", "max_model_len": 4096},
            {"id": "odd", "max_model_len": True},
            {"id": "zero", "max_model_len": 0},
        ],
    }
    assert model_contexts(orjson.dumps(vllm)) == {"SmolLM2-135M-Instruct": 4096, "lora-a": 4096}
    llama = {"object": "list", "data": [{"id": "m", "meta": {"n_ctx_train": 8192}}]}
    assert model_contexts(orjson.dumps(llama)) == {}
    assert model_contexts(b"<html>") == {}


@pytest.mark.parametrize(
    ("entries", "owner"),
    [
        ([{"id": "a", "owned_by": "vllm"}, {"id": "lora", "owned_by": "vllm"}], "vllm"),
        ([{"id": "m", "object": "model", "owned_by": "llamacpp", "meta": {}}], "llamacpp"),
        ([{"id": "a", "owned_by": "vllm"}, {"id": "b", "owned_by": "sglang"}], None),
        ([{"id": "a"}], None),
        ([{"id": "a", "owned_by": ""}], None),
        ([], None),
    ],
    ids=["vllm", "llamacpp", "two-engines-behind-a-gateway", "none", "empty", "no-models"],
)
def test_model_owner_is_the_name_every_entry_shares(
    entries: list[dict[str, Any]], owner: str | None
) -> None:
    assert model_owner(orjson.dumps({"object": "list", "data": entries})) == owner


def test_model_owner_of_what_is_not_a_model_list() -> None:
    assert model_owner(b"<html>") is None
    assert model_owner(b'{"data": {"id": "a"}}') is None


# ------------------------------------------------------------------------- pure: rewriting


def test_no_default_is_sent_where_the_context_is_within_it() -> None:
    """Context 4096 < default 8192: the engine's own limit (the rest of the context) applies."""
    body = {"model": "m", "messages": MESSAGES}
    rw = rewrite_request(body, "chat", POLICY, engine_limit=4096)
    assert "max_tokens" not in rw.body and "max_completion_tokens" not in rw.body
    assert (rw.max_tokens, rw.max_tokens_action, rw.engine_limited) == (4096, None, True)
    assert rw.max_tokens_header == "engine; value=4096"


def test_the_default_stays_where_the_context_is_larger() -> None:
    rw = rewrite_request({"model": "m", "messages": MESSAGES}, "chat", POLICY, engine_limit=32768)
    assert rw.body["max_tokens"] == 8192
    assert (rw.max_tokens_action, rw.engine_limited) == ("defaulted", False)


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_clients_own_limit_is_the_clients(field: str) -> None:
    """Even above the context: the engine's refusal is the answer it would have had."""
    body = {"model": "m", "messages": MESSAGES, field: 6000}
    rw = rewrite_request(body, "chat", POLICY, engine_limit=4096)
    assert rw.body[field] == 6000
    assert rw.max_tokens_header == "unchanged; value=6000"


def test_responses_get_no_default_above_the_context() -> None:
    rw = rewrite_request({"model": "m", "input": "hi"}, "responses", POLICY, engine_limit=4096)
    assert "max_output_tokens" not in rw.body
    assert rw.max_tokens_header == "engine; value=4096"
    rw = rewrite_request({"model": "m", "input": "hi"}, "responses", POLICY, engine_limit=9000)
    assert rw.body["max_output_tokens"] == 8192


def test_heal_through_chat_sends_no_limit_either() -> None:
    """A Responses request healed through the chat route keeps the engine's own limit."""
    rw = rewrite_request({"model": "m", "input": "hi"}, "responses", POLICY, engine_limit=4096)
    chat = via_chat.to_chat("responses", rw, usage=True, logprobs=False)
    assert not isinstance(chat, str)
    assert "max_tokens" not in chat.body and chat.engine_limited
    rw = rewrite_request(
        {"model": "m", "input": "hi", "max_output_tokens": 50},
        "responses",
        POLICY,
        engine_limit=4096,
    )
    chat = via_chat.to_chat("responses", rw, usage=True, logprobs=False)
    assert not isinstance(chat, str) and chat.body["max_tokens"] == 50


# ------------------------------------------------------------------------- the look-up


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_concurrent_first_requests_share_one_lookup_and_unknown_models_wait() -> None:
    """One GET /v1/models for many first requests; a model still unknown is not looked up again
    before RETRY_AFTER (an engine that lists no context costs nothing per request)."""
    calls = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        assert request.url.path == "/v1/models"
        assert request.headers["authorization"] == "Bearer k"
        await asyncio.sleep(0.05)
        entry = {"id": "a", "max_model_len": 4096, "owned_by": "vllm"}
        return httpx.Response(200, json={"data": [entry]})

    clock = _Clock()
    contexts = EngineContexts(clock=clock)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        assert contexts.should_learn("a")
        headers = {"authorization": "Bearer k"}
        await asyncio.gather(*(contexts.learn(client, "http://e/", headers) for _ in range(5)))
        assert calls == 1
        assert (contexts.get("a"), contexts.get(None)) == (4096, 4096)
        assert contexts.owner == "vllm"  # the same list names the engine
        assert not contexts.should_learn("a")
        assert not contexts.should_learn("b")
        clock.now += RETRY_AFTER
        assert contexts.should_learn("b")


async def test_a_failed_lookup_never_raises() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    contexts = EngineContexts()
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        await contexts.learn(client, "http://e", {})
    assert contexts.get("a") is None


def test_a_refusal_teaches_the_models_context() -> None:
    contexts = EngineContexts()
    contexts.learned("a", ContextError(4096, 12))
    assert contexts.get("a") == 4096
    contexts.update({"a": 2048, "b": 2048})
    assert (contexts.get("a"), contexts.get(None)) == (2048, None)


# ------------------------------------------------------------------- a proxy, a fake engine


def _chat(base: str, **fields: Any) -> httpx.Response:
    body = {"model": "fake-model", "messages": MESSAGES, **fields}
    return httpx.post(base + "/v1/chat/completions", json=body, timeout=HANG_GUARD)


def _models_lookups(fake: FakeVLLM) -> int:
    return sum(r.path == "/v1/models" for r in fake.requests)


def test_a_listed_context_is_used_from_the_first_request(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """The engine lists 4096: no request carries the default, none is refused, one look-up."""
    fake_upstream.script = Script(texts=["Hello."], max_model_len=4096)
    base = proxy_server()
    for _ in range(2):
        r = _chat(base)
        assert r.status_code == 200, r.text
        assert r.headers["x-guard-max-tokens"] == "engine; value=4096"
        assert "max_tokens" not in fake_upstream.last.json
    assert len(fake_upstream.guarded_requests()) == 2
    assert _models_lookups(fake_upstream) == 1


@pytest.mark.parametrize("mode", ["enforce", "heal", "off"])
def test_a_refused_default_is_sent_again_without_it(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, mode: str
) -> None:
    """An engine that lists no context refuses the default: the client still gets the answer,
    and the next request goes without the default straight away."""
    fake_upstream.list_max_model_len = False
    fake_upstream.script = Script(texts=["Hello."], max_model_len=4096)
    base = proxy_server(mode=mode)
    r = _chat(base)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Hello."
    assert r.headers["x-guard-max-tokens"] == "engine; value=4096"
    first, retry = fake_upstream.guarded_requests()
    assert first.json["max_tokens"] == 8192 and "max_tokens" not in retry.json
    assert retry.json["stream"] is (mode != "off")
    r = _chat(base, stream=True)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    assert len(fake_upstream.guarded_requests()) == 3
    assert "max_tokens" not in fake_upstream.last.json


@pytest.mark.parametrize("wording", ["0.10", "old"])
def test_older_vllm_refusals_of_prompt_plus_default(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, wording: str
) -> None:
    """Older vLLM checks prompt + limit: a context larger than the default can still refuse it.
    The retry sends no limit; the engine's own is what is left of the context."""
    fake_upstream.script = Script(
        texts=["Hello."], max_model_len=8195, prompt_tokens=7, context_wording=wording
    )
    base = proxy_server()
    r = _chat(base)
    assert r.status_code == 200, r.text
    assert r.headers["x-guard-max-tokens"] == "engine; value=8188"
    first, retry = fake_upstream.guarded_requests()
    assert first.json["max_tokens"] == 8192 and "max_tokens" not in retry.json


def test_a_clients_own_limit_that_does_not_fit_gets_the_engines_error(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """Not the proxy's to fix: the client gets what the engine answers, with one request."""
    fake_upstream.list_max_model_len = False
    fake_upstream.script = Script(texts=["Hello."], max_model_len=4096)
    base = proxy_server()
    r = _chat(base, max_tokens=5000)
    assert r.status_code == 400
    assert "max_tokens=5000 cannot be greater than max_model_len=4096" in r.text
    assert len(fake_upstream.guarded_requests()) == 1


@pytest.mark.parametrize("listed", [True, False])
def test_responses_without_max_output_tokens_are_served(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, listed: bool
) -> None:
    fake_upstream.list_max_model_len = listed
    fake_upstream.script = Script(texts=["Hello."], max_model_len=4096)
    base = proxy_server()
    r = httpx.post(
        base + "/v1/responses", json={"model": "fake-model", "input": "hi"}, timeout=HANG_GUARD
    )
    assert r.status_code == 200, r.text
    assert r.json()["output"][0]["content"][0]["text"] == "Hello."
    assert "max_output_tokens" not in fake_upstream.last.json
    assert len(fake_upstream.guarded_requests()) == (1 if listed else 2)


# ------------------------------------------------------------------- heal's continuations

LOOPING = "Once upon a time a fox lived in the woods near a river. " + "The answer is. " * 300
ENDING = " And then the fox went home."


def test_a_heal_continuation_keeps_the_engines_own_limit(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """The first stage sent no limit (context within the default): neither does the
    continuation, which the engine would refuse with a budget counted from the default."""
    fake_upstream.script = Script(max_model_len=4096)
    fake_upstream.scripts = [
        Script(texts=[LOOPING], chunk_delay=0.001, max_model_len=4096),
        Script(texts=[ENDING], max_model_len=4096),
    ]
    r = _chat(proxy_server(mode="heal"))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].endswith(ENDING)
    first, second = fake_upstream.guarded_requests()
    assert second.json["continue_final_message"] is True
    assert "max_tokens" not in first.json and "max_tokens" not in second.json


def test_a_continuation_refused_for_its_grown_prompt_is_sent_again_within_the_context(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """Older vLLM checks prompt + limit; the continuation's prompt holds the kept text as the
    engine re-tokenizes it. Refused, it is sent once more with what the context has left."""
    old = {"max_model_len": 1010, "context_wording": "old"}
    fake_upstream.scripts = [
        Script(texts=[LOOPING], chunk_delay=0.001, prompt_tokens=7, **old),  # type: ignore[arg-type]
        Script(texts=[ENDING], prompt_tokens=600, **old),  # type: ignore[arg-type]
        Script(texts=[ENDING], prompt_tokens=600, **old),  # type: ignore[arg-type]
    ]
    fake_upstream.list_max_model_len = False
    r = _chat(proxy_server(mode="heal"), max_tokens=1000)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].endswith(ENDING)
    first, refused, retry = fake_upstream.guarded_requests()
    assert first.json["max_tokens"] == 1000
    assert refused.json["max_tokens"] > 410
    assert retry.json["max_tokens"] == 410


def test_tokens_saved_count_from_what_the_context_had_left(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """An aborted answer under the engine's own limit saved the rest of the context after the
    prompt, not the whole context."""
    fake_upstream.script = Script(
        texts=[LOOPING], chunk_delay=0.001, max_model_len=4096, prompt_tokens=96
    )
    metrics = Metrics()
    r = _chat(proxy_server(metrics=metrics))
    assert r.status_code == 200 and r.headers["x-guard-max-tokens"] == "engine; value=4096"
    assert r.json()["choices"][0]["guard"]["action"] == "aborted"
    q = metrics.quality_registry
    labels = {"model": "fake-model"}
    deadline = time.monotonic() + HANG_GUARD
    while q.get_sample_value("guard_tokens_saved_total", labels) is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    saved = q.get_sample_value("guard_tokens_saved_total", labels)
    generated = q.get_sample_value("guard_completion_tokens_sum", labels)
    assert saved is not None and generated is not None
    assert saved + generated == 4096 - 96
