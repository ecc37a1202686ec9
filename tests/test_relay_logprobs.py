"""GUARD_REQUEST_LOGPROBS: the proxy asks for the sampled token's log-probability, feeds it to
the detector, and the client that did not ask receives exactly the bytes the engine writes
without logprobs (``"logprobs":null`` where the object was)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core import chunks
from proxy.core.guard import GuardPolicy, StreamGuard
from proxy.core.rewrite import RewritePolicy, rewrite_request
from proxy.detect import Detector, Verdict
from tests.fakes.vllm import FakeVLLM, Script

TEXT = 'A {brace} and a "quote" \\ back, naïve 🙂\u2028, then plain words to end the answer.'


def _with_logprobs(event: bytes, chat: bool) -> bytes:
    """``event`` as the engine writes it when asked for logprobs (one entry per chunk)."""
    if not event.startswith(b"data: {"):
        return event
    chunk = orjson.loads(event[6:])
    if not chunk.get("choices"):
        return event
    choice = chunk["choices"][0]
    token = choice["delta"].get("content", "") if chat else choice.get("text", "")
    if chat:
        lp: Any = {
            "content": [
                {
                    "token": token,
                    "logprob": -0.25,
                    "bytes": list(token.encode()),
                    "top_logprobs": [],
                }
            ]
        }
    else:
        lp = {
            "text_offset": [0],
            "token_logprobs": [-0.25],
            "tokens": [token],
            "top_logprobs": [{token: -0.25, "}{": -3.5}],
        }
    null = b'"logprobs":null'
    assert event.count(null) == 1
    return event.replace(null, b'"logprobs":' + orjson.dumps(lp))


def _events(chat: bool) -> list[bytes]:
    req = {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    events = FakeVLLM()._events(req, chat, Script(texts=[TEXT]))
    return [e for e in events if e is not None]


class Recorder(Detector):
    """The real detector, remembering the logprobs it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def feed(
        self, delta: str, *, tokens: int | None = None, logprobs: list[Any] | None = None
    ) -> Verdict | None:
        self.seen.extend(logprobs or [])
        return super().feed(delta, tokens=tokens, logprobs=logprobs)


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize("per_event", [True, False], ids=["per-event", "whole"])
@pytest.mark.parametrize("strip_usage", [True, False])
def test_client_bytes_are_those_of_a_request_without_logprobs(
    chat: bool, per_event: bool, strip_usage: bool
) -> None:
    plain = _events(chat)
    with_lp = [_with_logprobs(e, chat) for e in plain]
    assert with_lp != plain
    common: dict[str, Any] = {
        "endpoint": "chat" if chat else "completions",
        "strip_chunk_usage": strip_usage,
        "strip_final_usage": strip_usage,
        "usage_null": not chat,
    }

    def run(events: list[bytes], strip: bool) -> tuple[bytes, list[Any]]:
        detectors: list[Recorder] = []

        def make() -> Recorder:
            detectors.append(Recorder())
            return detectors[-1]

        g = StreamGuard(GuardPolicy.create(strip_logprobs=strip, **common), make)
        reads = events if per_event else [b"".join(events)]
        out = b"".join(g.feed(r) for r in reads) + g.eof()
        return out, [entry for d in detectors for entry in d.seen]

    expected, no_signal = run(plain, False)
    got, signal = run(with_lp, True)
    assert got == expected
    assert no_signal == []
    assert [e["logprob"] for e in signal] == [-0.25] * (len(plain) - 4 + (0 if chat else 1))
    # A client that asked for logprobs gets them untouched.
    kept, _ = run(with_lp, False)
    if not strip_usage:
        assert kept == b"".join(with_lp)


def test_an_aborted_chunk_carries_no_logprobs_the_client_did_not_ask_for() -> None:
    loop = "The answer is the answer. " * 200
    req = {"model": "m", "stream": True}
    plain = [e for e in FakeVLLM()._events(req, True, Script(texts=[loop])) if e is not None]
    with_lp = [_with_logprobs(e, True) for e in plain]
    g = StreamGuard(GuardPolicy.create(strip_logprobs=True), Detector)
    out = b"".join(g.feed(e) for e in with_lp)
    assert g.aborted
    assert b'"content":[' not in out
    sent = [orjson.loads(b[6:]) for b in out.split(b"\n\n") if b.startswith(b"data: {")]
    [ended] = [c for e in sent for c in e["choices"] if c.get("finish_reason")]
    assert ended["finish_reason"] == "content_filter" and ended["logprobs"] is None


_TOKEN = st.text(max_size=6)


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(_TOKEN, max_size=4),
    n=st.integers(1, 3),
    completions=st.booleans(),
)
def test_null_logprobs_is_what_orjson_writes_with_null(
    tokens: list[str], n: int, completions: bool
) -> None:
    choices = []
    for i in range(n):
        if completions:
            lp: Any = {
                "text_offset": list(range(len(tokens))),
                "token_logprobs": [-1.5] * len(tokens),
                "tokens": tokens,
                "top_logprobs": [{t: -1.5, "logprobs": -2.0} for t in tokens],
            }
            choice: dict[str, Any] = {"index": i, "text": "".join(tokens), "logprobs": lp}
        else:
            lp = {
                "content": [
                    {"token": t, "logprob": -1.5, "bytes": list(t.encode()), "top_logprobs": []}
                    for t in tokens
                ]
            }
            choice = {"index": i, "delta": {"content": "".join(tokens)}, "logprobs": lp}
        choice["finish_reason"] = None
        choices.append(choice)
    chunk = {"id": "x", "model": '"logprobs":{', "choices": choices}
    nulled = {**chunk, "choices": [{**c, "logprobs": None} for c in choices]}
    assert chunks.null_logprobs(orjson.dumps(chunk)) == orjson.dumps(nulled)


def test_unbalanced_logprobs_are_left_to_the_caller() -> None:
    assert chunks.null_logprobs(b'{"logprobs":{"content":[') is None
    assert chunks.null_logprobs(b'{"logprobs":null}') == b'{"logprobs":null}'


def _rewrite(body: dict[str, Any], endpoint: Any = "chat", on: bool = True) -> Any:
    return rewrite_request(body, endpoint, RewritePolicy(request_logprobs=on))


def test_rewrite_asks_chat_for_the_chosen_token_only() -> None:
    rw = _rewrite({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert rw.body["logprobs"] is True and rw.body["top_logprobs"] == 0
    assert rw.injected_logprobs
    policy = GuardPolicy.for_request(
        "chat", rw, "enforce", abort_finish_reason="stop", injected_usage=True,
        client_continuous=False,
    )  # fmt: skip
    assert policy.strip_logprobs


def test_rewrite_asks_completions_for_logprobs_1() -> None:
    rw = _rewrite({"model": "m", "prompt": "hi"}, "completions")
    assert rw.body["logprobs"] == 1 and rw.injected_logprobs


@pytest.mark.parametrize(
    "extra",
    [{"logprobs": True}, {"logprobs": True, "top_logprobs": 3}, {"top_logprobs": 2}],
)
def test_a_client_that_asked_keeps_its_own_logprobs_request(extra: dict[str, Any]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    rw = _rewrite(body)
    assert not rw.injected_logprobs
    assert {k: rw.body.get(k) for k in extra} == extra


def test_off_asks_for_nothing() -> None:
    rw = _rewrite({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, on=False)
    assert "logprobs" not in rw.body and not rw.injected_logprobs
