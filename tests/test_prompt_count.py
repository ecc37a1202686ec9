"""The usage of an aborted answer carries the engine's count of the prompt, or leaves it out.

Against a real uvicorn-served engine that reports usage only when an answer ends (as llama.cpp
does; vLLM's Responses route too) and counts prompts on ``POST /tokenize`` in vLLM's or
llama.cpp's dialect (:mod:`tests.servers.counting_engine`), through the real proxy. The count
an aborted answer reports is compared with the one the same engine reports for the same prompt
when its answer is not cut: the engine's own number, never one the proxy made up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from proxy.core.prompt_count import CountAsk, prompt_count_ask, read_count, renders_apart
from proxy.server.prompt_count import PROMPT_COUNT_USER_AGENT
from tests.net import HANG_GUARD
from tests.servers.counting_engine import CountingEngine, Dialect
from tests.servers.engines import UvicornEngine
from tests.usage_reading import events, prompt_count, usage_of

ProxyFactory = Callable[..., str]
SURFACES = ["chat", "completions", "responses", "messages"]
PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
LOOP = {"x-test-answer": "loop"}


def request(surface: str, stream: bool) -> dict[str, Any]:
    """A request of ``surface`` with a system text and a question (one prompt for every
    surface)."""
    system, question = "Answer briefly.", "Tell me a long story about dragons, please."
    body: dict[str, Any] = {"model": "m", "stream": stream}
    if surface == "chat":
        body["messages"] = [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ]
        if stream:
            body["stream_options"] = {"include_usage": True}
    elif surface == "completions":
        body["prompt"] = f"{system} {question}"
        if stream:
            body["stream_options"] = {"include_usage": True}
    elif surface == "responses":
        body.update(instructions=system, input=question)
    else:
        body.update(system=system, messages=[{"role": "user", "content": question}])
        body["max_tokens"] = 2000
    return body


def ask(base: str, surface: str, stream: bool, headers: dict[str, str]) -> Any:
    """The answer's JSON (not streamed) or its events (streamed)."""
    resp = httpx.post(
        base + PATHS[surface], json=request(surface, stream), headers=headers, timeout=HANG_GUARD
    )
    assert resp.status_code == 200, resp.text
    return events(resp.content) if stream else resp.json()


@pytest.fixture
def engine() -> Iterator[Callable[..., tuple[CountingEngine, str]]]:
    """Factory: ``engine(dialect, continuous=False) -> (app, url)`` of a running engine."""
    running: list[UvicornEngine] = []

    def start(dialect: Dialect = "vllm", **options: Any) -> tuple[CountingEngine, str]:
        app = CountingEngine(dialect, **options)
        server = UvicornEngine(app).__enter__()
        running.append(server)
        return app, server.url

    yield start
    for server in running:
        server.__exit__(None, None, None)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
@pytest.mark.parametrize("dialect", ["vllm", "llamacpp"])
@pytest.mark.parametrize("surface", SURFACES)
def test_an_aborted_answer_reports_the_engines_count_of_the_prompt(
    engine: Any, proxy_server: ProxyFactory, surface: str, dialect: Dialect, stream: bool
) -> None:
    """The engine sent no usage before the abort: the proxy asks it (its own user agent, in
    its own dialect) and the usage carries the count the engine reports for the same prompt
    when the answer is not cut; the totals agree with it."""
    app, url = engine(dialect)
    base = proxy_server(upstream_url=url)
    healthy, aborted = usage_of(surface, stream, ask(base, surface, stream, {}))
    assert not aborted
    engines_own = prompt_count(surface, healthy)
    assert engines_own is not None and engines_own > 0
    assert app.counts() == []  # an answer that was not cut asks nothing

    usage, aborted = usage_of(surface, stream, ask(base, surface, stream, LOOP))
    assert aborted
    assert prompt_count(surface, usage) == engines_own
    counts = app.counts()
    assert counts and {a.user_agent for a in counts} == {PROMPT_COUNT_USER_AGENT}
    if dialect == "llamacpp" and surface != "completions":
        assert [a.path for a in counts] == ["/tokenize", "/apply-template", "/tokenize"]
    else:
        assert [a.path for a in counts] == ["/tokenize"]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
@pytest.mark.parametrize("surface", SURFACES)
def test_without_the_engines_count_the_usage_leaves_it_out(
    engine: Any, proxy_server: ProxyFactory, surface: str, stream: bool
) -> None:
    """An engine that serves no ``/tokenize``: the aborted answer still ends as it should, its
    usage without a prompt count (Responses: ``usage`` null, as its SDK types require every
    count of a usage), never 0."""
    app, url = engine("none")
    base = proxy_server(upstream_url=url)
    usage, aborted = usage_of(surface, stream, ask(base, surface, stream, LOOP))
    assert aborted
    assert prompt_count(surface, usage) is None
    if surface == "responses":
        assert usage is None
    else:
        assert usage["completion_tokens" if surface in ("chat", "completions") else "output_tokens"]
    assert [a.path for a in app.counts()] == ["/tokenize"]


@pytest.mark.parametrize("surface", SURFACES)
def test_an_engine_that_does_not_answer_the_count_delays_the_ending_no_longer_than_the_timeout(
    engine: Any, proxy_server: ProxyFactory, surface: str
) -> None:
    """``/tokenize`` never answers: the proxy gives up (closes that connection) at
    GUARD_PROMPT_COUNT_TIMEOUT and ends the stream with the count left out."""
    app, url = engine("hang")
    base = proxy_server(upstream_url=url, prompt_count_timeout=0.2)
    usage, aborted = usage_of(surface, True, ask(base, surface, True, LOOP))
    assert aborted and prompt_count(surface, usage) is None
    [counted] = app.counts()
    assert counted.gave_up.wait(HANG_GUARD)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_heal_that_gives_up_reports_the_engines_count_too(
    engine: Any, proxy_server: ProxyFactory, stream: bool
) -> None:
    """Heal mode with no continuation left ends the answer as enforce does, its usage counted
    the same way."""
    app, url = engine("llamacpp")
    base = proxy_server(upstream_url=url, mode="heal", heal_max_attempts=0)
    healthy, _ = usage_of("chat", stream, ask(base, "chat", stream, {}))
    usage, aborted = usage_of("chat", stream, ask(base, "chat", stream, LOOP))
    assert aborted and prompt_count("chat", usage) == prompt_count("chat", healthy)
    assert [a.path for a in app.counts()] == ["/tokenize", "/apply-template", "/tokenize"]


@pytest.mark.parametrize("surface", ["chat", "completions"])
def test_a_count_the_engine_sent_before_the_abort_is_used_as_is(
    engine: Any, proxy_server: ProxyFactory, surface: str
) -> None:
    """An engine that sends usage in every chunk (vLLM with the proxy's usage options) has
    counted the prompt before the abort: nothing is asked."""
    app, url = engine("vllm", continuous=True)
    base = proxy_server(upstream_url=url)
    healthy, _ = usage_of(surface, True, ask(base, surface, True, {}))
    usage, aborted = usage_of(surface, True, ask(base, surface, True, LOOP))
    assert aborted and prompt_count(surface, usage) == prompt_count(surface, healthy)
    assert app.counts() == []


def test_a_timeout_of_zero_never_asks(engine: Any, proxy_server: ProxyFactory) -> None:
    app, url = engine("vllm")
    base = proxy_server(upstream_url=url, prompt_count_timeout=0)
    usage, aborted = usage_of("chat", True, ask(base, "chat", True, LOOP))
    assert aborted and prompt_count("chat", usage) is None
    assert app.counts() == []


# ---------------------------------------------------------------- what is asked (pure)
CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("endpoint", "body", "expected"),
    [
        (
            "chat",
            {"model": "m", "messages": CHAT},
            CountAsk({"model": "m", "messages": CHAT}, True),
        ),
        (
            "chat",
            {"messages": CHAT, "tools": [{"type": "function"}], "temperature": 0.2},
            CountAsk({"messages": CHAT, "tools": [{"type": "function"}]}, True),
        ),
        ("chat", {"messages": CHAT, "documents": [{"text": "x"}]}, None),
        (
            "completions",
            {"model": "m", "prompt": "Once"},
            CountAsk(
                {
                    "model": "m",
                    "prompt": "Once",
                    "content": "Once",
                    "add_special": True,
                    "parse_special": True,
                },
                False,
            ),
        ),
        ("completions", {"prompt": [1, 2, 3]}, 3),
        ("completions", {"prompt": [[1, 2, 3, 4]]}, 4),
        ("completions", {"prompt": ["a", "b"]}, None),
        (
            "responses",
            {"model": "m", "input": "hi", "instructions": "Be brief."},
            CountAsk(
                {
                    "model": "m",
                    "messages": [
                        {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "hi"},
                    ],
                },
                True,
            ),
        ),
        ("responses", {"input": "hi", "tools": [{"type": "function", "name": "f"}]}, None),
        (
            "messages",
            {"system": "Be brief.", "messages": CHAT, "max_tokens": 5},
            CountAsk({"messages": [{"role": "system", "content": "Be brief."}, *CHAT]}, True),
        ),
        ("messages", {"messages": CHAT, "max_tokens": 5, "tools": [{"name": "f"}]}, None),
    ],
    ids=[
        "chat",
        "chat-tools",
        "chat-documents",
        "completions",
        "completions-token-ids",
        "completions-one-list",
        "completions-batch",
        "responses",
        "responses-tools",
        "messages",
        "messages-tools",
    ],
)
def test_what_is_asked_is_the_prompt_the_engine_renders(
    endpoint: Any, body: dict[str, Any], expected: Any
) -> None:
    """Only the fields that change the rendered prompt; a request whose prompt the ask could
    not render exactly is not asked; token ids are counted without asking."""
    assert prompt_count_ask(endpoint, body) == expected


@pytest.mark.parametrize(
    ("answer", "count", "apart"),
    [
        ({"count": 32, "max_model_len": 4096, "tokens": [1] * 32}, 32, False),
        ({"tokens": [5, 6, 7]}, 3, True),
        ({"tokens": []}, None, True),  # llama.cpp's answer to a body without content
        ({"count": 0, "tokens": []}, None, False),
        ({"detail": "Not Found"}, None, False),
        (None, None, False),
    ],
    ids=["vllm", "llamacpp", "llamacpp-no-content", "zero", "other", "not-json"],
)
def test_only_a_positive_count_is_read(answer: Any, count: int | None, apart: bool) -> None:
    assert read_count(answer) == count
    assert renders_apart(answer) is apart
