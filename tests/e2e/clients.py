"""Real client libraries, each asked one short question the way its users write it.

Each function takes the server's base URL (the engine's or the proxy's), the served model and a
token limit (``None``: the client's default, which for all but the Anthropic SDK is to send no
limit at all) and returns the answer's text; a client's failure is its own exception, which the
tests compare between the engine and the proxy. Greedy wherever the client lets us say so, so
the engine's answer and the proxy's can be compared word for word.

The ``llm`` CLI runs as a subprocess, as its users run it, with its own configuration directory
(``LLM_USER_PATH``) naming the server as an OpenAI-compatible model.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

QUESTION = "What is the capital of France? Answer in one word."
KEY = "sk-e2e"

Client = Callable[[str, str, "int | None"], str]


def openai_chat(base: str, model: str, limit: int | None) -> str:
    import openai

    extra: dict[str, Any] = {} if limit is None else {"max_tokens": limit}
    with openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0) as client:
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": QUESTION}],
            temperature=0,
            stream=True,
            **extra,
        )
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def openai_responses(base: str, model: str, limit: int | None) -> str:
    import openai

    extra: dict[str, Any] = {} if limit is None else {"max_output_tokens": limit}
    with openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0) as client:
        return client.responses.create(
            model=model, input=QUESTION, temperature=0, **extra
        ).output_text


def anthropic_messages(base: str, model: str, limit: int | None) -> str:
    """The SDK requires ``max_tokens`` (so does the API): no case without it."""
    import anthropic

    assert limit is not None
    with (
        anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0) as client,
        client.messages.stream(
            model=model,
            max_tokens=limit,
            messages=[{"role": "user", "content": QUESTION}],
            extra_body={"temperature": 0},
        ) as stream,
    ):
        return "".join(stream.text_stream)


def _agents(base: str, model: str, limit: int | None, api: str) -> str:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    async def run() -> str:
        client = AsyncOpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
        kind = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
        agent = Agent(
            name="assistant",
            model=kind(model=model, openai_client=client),
            model_settings=ModelSettings(temperature=0, max_tokens=limit),
        )
        try:
            result = await Runner.run(agent, QUESTION)
            return str(result.final_output)
        finally:
            await client.close()

    return asyncio.run(run())


def agents_responses(base: str, model: str, limit: int | None) -> str:
    """openai-agents' default model API (Responses)."""
    return _agents(base, model, limit, "responses")


def agents_chat(base: str, model: str, limit: int | None) -> str:
    return _agents(base, model, limit, "chat")


def pydantic_ai_agent(base: str, model: str, limit: int | None) -> str:
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.settings import ModelSettings

    settings = ModelSettings(temperature=0)
    if limit is not None:
        settings["max_tokens"] = limit

    async def run() -> str:
        async with AsyncOpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0) as client:
            provider = OpenAIProvider(openai_client=client)
            agent = Agent(OpenAIChatModel(model, provider=provider), model_settings=settings)
            return str((await agent.run(QUESTION)).output)

    return asyncio.run(run())


def instructor_structured(base: str, model: str, limit: int | None) -> str:
    import instructor
    import openai
    from pydantic import BaseModel, Field

    class Capital(BaseModel):
        city: str = Field(max_length=40)

    extra: dict[str, Any] = {} if limit is None else {"max_tokens": limit}
    with openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0) as raw:
        client = instructor.from_openai(raw, mode=instructor.Mode.JSON_SCHEMA)
        answer = client.chat.completions.create(
            model=model,
            response_model=Capital,
            messages=[{"role": "user", "content": QUESTION}],
            temperature=0,
            max_retries=0,
            **extra,
        )
        return answer.city


def langchain_invoke(base: str, model: str, limit: int | None) -> str:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=model, base_url=base + "/v1", api_key=KEY, temperature=0, max_tokens=limit,
        max_retries=0,
    )  # fmt: skip
    return str(llm.invoke(QUESTION).content)


def litellm_completion(base: str, model: str, limit: int | None) -> str:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    extra: dict[str, Any] = {} if limit is None else {"max_tokens": limit}
    response = litellm.completion(
        model="openai/" + model,
        api_base=base + "/v1",
        api_key=KEY,
        messages=[{"role": "user", "content": QUESTION}],
        temperature=0,
        num_retries=0,
        **extra,
    )
    return str(response.choices[0].message.content)


def llm_cli(base: str, model: str, limit: int | None) -> str:
    """``llm -m <alias> "question"``, the server registered in ``extra-openai-models.yaml``."""
    with tempfile.TemporaryDirectory() as home:
        Path(home, "extra-openai-models.yaml").write_text(
            f"- model_id: e2e\n  model_name: {model}\n  api_base: {base}/v1\n  api_key_name: e2e\n"
        )
        Path(home, "keys.json").write_text(f'{{"e2e": "{KEY}"}}')
        command = [sys.executable, "-m", "llm", "-m", "e2e", "-o", "temperature", "0", "--no-log"]
        if limit is not None:
            command += ["-o", "max_tokens", str(limit)]
        env = {**os.environ, "LLM_USER_PATH": home}
        done = subprocess.run(
            [*command, QUESTION], env=env, capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise RuntimeError(f"llm exited {done.returncode}: {done.stderr.strip()[-500:]}")
        return done.stdout.strip()


#: name -> (client, surface the proxy sees, whether it can send no limit)
CLIENTS: dict[str, tuple[Client, str, bool]] = {
    "openai-chat": (openai_chat, "chat", True),
    "openai-responses": (openai_responses, "responses", True),
    "anthropic-messages": (anthropic_messages, "messages", False),
    "agents-responses": (agents_responses, "responses", True),
    "agents-chat": (agents_chat, "chat", True),
    "pydantic-ai": (pydantic_ai_agent, "chat", True),
    "instructor": (instructor_structured, "chat", True),
    "langchain-openai": (langchain_invoke, "chat", True),
    "litellm": (litellm_completion, "chat", True),
    "llm-cli": (llm_cli, "chat", True),
}


def outcome(client: Client, base: str, model: str, limit: int | None) -> tuple[str, str]:
    """``("ok", text)`` or ``("error", what the client raised, in short)``."""
    try:
        return "ok", client(base, model, limit).strip()
    except Exception as exc:  # what the client raised is the outcome compared
        status = getattr(exc, "status_code", None) or getattr(exc, "status", None)
        return "error", f"{type(exc).__name__}({status}): {str(exc)[:300]}"
