"""The stream guard on the Responses and Messages surfaces (pure): bytes in, bytes out.

Streams are vLLM 0.32's own, recorded from SmolLM2-135M-Instruct (``tests/streams/surfaces/``:
a healthy answer, one cut by the token limit, and a real greedy loop), plus the fake engine's
recorded-shape streams for reasoning and tool calls, which SmolLM2 does not produce.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.guard import GuardPolicy, StreamGuard
from proxy.detect import Detector
from proxy.errors import UpstreamError
from tests.fakes.vllm import Script, messages_events, responses_events

STREAMS = Path(__file__).parent / "streams" / "surfaces"
HEALTHY = sorted(p for p in STREAMS.glob("*.sse") if "loop" not in p.name)
LOOP = "The answer is the answer. " * 200


def surface_of(path: Path) -> str:
    return path.name.split("_")[0]


def guard(endpoint: str, **kw: Any) -> StreamGuard:
    make_detector = kw.pop("make_detector", Detector)
    return StreamGuard(GuardPolicy.create(endpoint=endpoint, **kw), make_detector)  # type: ignore[arg-type]


def fake_stream(endpoint: str, script: Script, **req: Any) -> bytes:
    events = (responses_events if endpoint == "responses" else messages_events)(req, script)
    return b"".join(e for e in events if e is not None)


def events_of(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, JSON) of every event in ``data``."""
    out = []
    for block in data.split(b"\n\n"):
        if not block.strip():
            continue
        name, _, rest = block.partition(b"\n")
        assert name.startswith(b"event: "), block
        assert rest.startswith(b"data: "), block
        out.append((name[7:].decode(), orjson.loads(rest[6:])))
    return out


@pytest.mark.parametrize("path", HEALTHY, ids=lambda p: p.name)
def test_recorded_healthy_stream_passes_byte_identical(path: Path) -> None:
    whole = path.read_bytes()
    g = guard(surface_of(path))
    assert g.feed(whole) + g.eof() == whole
    assert g.outcome() == "completed"
    assert not g.aborted
    [record] = g.records(100)
    assert record.completion_tokens == (g.usage or {})["output_tokens"]
    assert record.finish_reason == ("length" if "length" in path.name else "stop")


@pytest.mark.parametrize("path", sorted(STREAMS.glob("*.sse")), ids=lambda p: p.name)
def test_every_byte_boundary_gives_identical_output(path: Path) -> None:
    """Healthy or aborted, any split of the upstream bytes gives the client the same bytes."""
    whole = path.read_bytes()
    endpoint = surface_of(path)

    def run(pieces: list[bytes]) -> bytes:
        g = guard(endpoint)
        out = b""
        for p in pieces:
            out += g.feed(p)
            if g.done:
                return out
        return out + g.eof()

    expected = run([whole])
    step = 1 if len(whole) < 6000 else 7
    for cut in range(1, len(whole), step):
        assert run([whole[:cut], whole[cut:]]) == expected, cut


_ALL = sorted(STREAMS.glob("*.sse"))
_WHOLE = {p.name: p.read_bytes() for p in _ALL}


def _run(endpoint: str, pieces: list[bytes]) -> bytes:
    g = guard(endpoint)
    out = b""
    for p in pieces:
        out += g.feed(p)
        if g.done:
            return out
    return out + g.eof()


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(_WHOLE)),
    cuts=st.lists(st.floats(min_value=0, max_value=1), max_size=40),
)
def test_any_number_of_splits_gives_identical_output(name: str, cuts: list[float]) -> None:
    """However the upstream bytes arrive (many reads, one-byte reads, CR/LF pairs split), the
    client gets what the unsplit stream gives."""
    whole = _WHOLE[name]
    points = sorted({int(c * len(whole)) for c in cuts} | {0, len(whole)})
    pieces = [whole[a:b] for a, b in itertools.pairwise(points)]
    endpoint = name.split("_")[0]
    assert _run(endpoint, pieces) == _run(endpoint, [whole])


def test_responses_real_loop_ends_like_the_engines_early_stop() -> None:
    """vLLM's own looping stream: after the delta that fired, the open part and item close with
    the text so far, ``response.completed`` with ``status: "incomplete"`` (vLLM's own ending of a
    response it stopped early) carries the guard's reason, and the sequence numbers run on
    without a gap. (Until the ending followed the engine's, it was ``response.incomplete``,
    which the openai SDK's stream helper rejects.)"""
    whole = (STREAMS / "responses_vllm_loop.sse").read_bytes()
    g = guard("responses", hold_ending=True)
    out = g.feed(whole)
    assert g.done and g.aborted and g.outcome() == "aborted"
    # vLLM counts the prompt only on its terminal event: the ending waits for the shell's ask.
    assert g.held is not None and g.prompt_uncounted
    g.counted(44)
    out += g.release()
    assert out.startswith(whole[: len(out) // 2])
    sent = events_of(out)
    names = [n for n, _ in sent]
    assert names[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert "response.incomplete" not in names
    assert [e["sequence_number"] for _, e in sent] == list(range(len(sent)))
    streamed = "".join(e["delta"] for n, e in sent if n == "response.output_text.delta")
    text_done, part_done, item_done, incomplete = (e for _, e in sent[-4:])
    assert text_done["text"] == streamed
    assert part_done["part"]["text"] == streamed
    assert item_done["item"]["status"] == "completed"
    assert item_done["item"]["content"][0]["text"] == streamed
    response = incomplete["response"]
    assert response["status"] == "incomplete"
    details = response["incomplete_details"]
    assert details["reason"] == "content_filter"
    assert details["guard"]["action"] == "aborted"
    assert details["guard"]["completion_tokens"] == g.choices[0].tokens
    assert response["output"] == [item_done["item"]]
    assert response["usage"]["output_tokens"] == g.choices[0].tokens
    assert response["usage"]["input_tokens"] == 44
    assert response["id"] == sent[0][1]["response"]["id"]
    [record] = g.records(220)
    assert record.detection_action == "aborted"
    assert record.finish_reason == "content_filter"


def test_messages_real_loop_ends_with_block_stop_message_delta_and_stop() -> None:
    whole = (STREAMS / "messages_vllm_loop.sse").read_bytes()
    g = guard("messages")
    out = g.feed(whole)
    assert g.done and g.aborted
    sent = events_of(out)
    assert [n for n, _ in sent[-3:]] == ["content_block_stop", "message_delta", "message_stop"]
    assert sum(n == "message_delta" for n, _ in sent) == 1
    delta = sent[-2][1]
    assert delta["delta"]["stop_reason"] == "refusal"
    assert delta["delta"]["stop_details"]["explanation"].startswith("coherence_guard:")
    assert delta["delta"]["guard"]["action"] == "aborted"
    assert delta["usage"] == {"input_tokens": 44, "output_tokens": g.choices[0].tokens}
    assert sent[-3][1] == {"type": "content_block_stop", "index": 0}


@pytest.mark.parametrize(
    ("mapped", "stop_reason", "incomplete"),
    [
        ("content_filter", "refusal", "content_filter"),
        ("repetition", "refusal", "content_filter"),
        ("length", "max_tokens", "max_output_tokens"),
        ("stop", "end_turn", "content_filter"),
    ],
)
def test_abort_reason_follows_the_configured_finish_reason(
    mapped: str, stop_reason: str, incomplete: str
) -> None:
    m = guard("messages", abort_finish_reason=mapped)
    sent = events_of(m.feed(fake_stream("messages", Script(texts=[LOOP]), max_tokens=2000)))
    assert sent[-2][1]["delta"]["stop_reason"] == stop_reason
    assert ("stop_details" in sent[-2][1]["delta"]) == (stop_reason == "refusal")
    r = guard("responses", abort_finish_reason=mapped)
    sent = events_of(r.feed(fake_stream("responses", Script(texts=[LOOP]))))
    assert sent[-1][1]["response"]["incomplete_details"]["reason"] == incomplete


def test_monitor_mode_forwards_a_loop_untouched_and_records_it() -> None:
    for endpoint in ("responses", "messages"):
        whole = (STREAMS / f"{endpoint}_vllm_loop.sse").read_bytes()
        g = guard(endpoint, mode="monitor")
        assert g.feed(whole) + g.eof() == whole
        assert g.outcome() == "completed"
        assert [r.detection_action for r in g.records(220)] == ["observed"]


def test_responses_one_detector_per_output_item() -> None:
    """A reasoning item and a message item get a detector each; a loop in the second item is
    cut there, with the finished reasoning item kept as the engine closed it."""
    script = Script(texts=["Sure. " + LOOP], reasoning="Let me think about this briefly.")
    g = guard("responses", hold_ending=True)
    out = g.feed(fake_stream("responses", script))
    g.counted(7)
    sent = events_of(out + g.release())
    assert sorted(g.choices) == [0, 1]
    assert g.choices[0].verdict is None and g.choices[1].action == "aborted"
    response = sent[-1][1]["response"]
    reasoning, message = response["output"]
    assert reasoning["type"] == "reasoning" and reasoning["status"] == "completed"
    assert message["status"] == "completed"  # as vLLM closes an item cut by the token limit
    assert response["status"] == "incomplete"
    assert g.choices[0].tokens + g.choices[1].tokens == response["usage"]["output_tokens"]
    assert response["usage"]["output_tokens_details"]["reasoning_tokens"] == g.choices[0].tokens


def test_responses_looping_tool_arguments_are_closed_as_a_function_call() -> None:
    args = '{"items": [' + ", ".join(['"again"'] * 400) + "]}"
    g = guard("responses")
    sent = events_of(g.feed(fake_stream("responses", Script(tool_call=("f", args)))))
    assert g.aborted
    names = [n for n, _ in sent[-3:]]
    assert names == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    streamed = "".join(e["delta"] for n, e in sent if n == "response.function_call_arguments.delta")
    assert sent[-3][1]["arguments"] == streamed and sent[-3][1]["name"] == "f"
    assert sent[-2][1]["item"]["arguments"] == streamed


def test_messages_each_channel_of_the_message_has_its_own_register() -> None:
    """One block per message, one register per channel in it: the answer's detector reads the
    text blocks only, the thinking and the tool input each have their own (as on chat for the
    same generation), and the message's summary counts all three."""
    seen: list[str] = []

    class Recording(Detector):
        def feed(self, text: str, **kw: Any) -> Any:
            seen.append(text)
            return super().feed(text, **kw)

    script = Script(texts=["The answer is 4."], reasoning="Two plus two.", tool_call=("f", "{}"))
    g = guard("messages", make_detector=Recording)
    whole = fake_stream("messages", script, max_tokens=100)
    assert g.feed(whole) + g.eof() == whole
    assert "".join(seen) == "The answer is 4."
    assert list(g.choices) == [0]
    side = g.choices[0].side
    assert side is not None and sorted(side.detectors) == ["reasoning", "tool"]
    [record] = g.records(100)
    assert record.finish_reason == "tool_calls"
    assert record.summary is not None
    assert record.summary.chars == len("Two plus two." + "The answer is 4." + "{}")


def test_ping_and_comments_pass_anywhere() -> None:
    whole = fake_stream("messages", Script(texts=["Hello there."]), max_tokens=50)
    events = whole.split(b"\n\n")
    ping = b'event: ping\ndata: {"type":"ping"}'
    whole = b"\n\n".join([events[0], ping, events[1], b": keep-alive", *events[2:]])
    g = guard("messages")
    assert g.feed(whole) + g.eof() == whole
    assert g.outcome() == "completed"


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_stream_cut_without_terminal_event_ends_with_an_error_event(endpoint: str) -> None:
    whole = fake_stream(endpoint, Script(texts=["one two three four"]), max_tokens=50)
    cut = whole.rindex(b"event: ") - 5
    g = guard(endpoint)
    out = g.feed(whole[:cut]) + g.eof()
    name, last = events_of(out)[-1]
    assert name == "error" and last["type"] == "error"
    assert g.outcome() == "upstream_error"
    if endpoint == "responses":
        seqs = [e["sequence_number"] for _, e in events_of(out)]
        assert seqs == list(range(len(seqs)))
    else:
        assert last["error"]["type"] == "api_error"


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_upstream_failure_mid_stream_is_an_error_event(endpoint: str) -> None:
    g = guard(endpoint)
    g.feed(fake_stream(endpoint, Script(texts=["one two three"]), max_tokens=50)[:600])
    name, event = events_of(g.upstream_failed(UpstreamError("gone")))[0]
    assert name == "error" and g.done and g.outcome() == "upstream_error"
    message = event["message"] if endpoint == "responses" else event["error"]["message"]
    assert message == "gone"


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_engine_error_event_ends_the_stream_as_an_upstream_error(endpoint: str) -> None:
    whole = fake_stream(endpoint, Script(texts=["one two three four"], mid_stream_error=2))
    g = guard(endpoint)
    assert g.feed(whole) == whole
    assert g.done and g.error is not None and g.outcome() == "upstream_error"


# ---------------------------------------------------------------- non-streamed answers
def test_responses_healthy_non_stream_is_the_engines_final_response() -> None:
    whole = (STREAMS / "responses_vllm.sse").read_bytes()
    g = guard("responses", collect=True)
    g.feed(whole)
    final = events_of(whole)[-1][1]["response"]
    assert g.response(trim=True) == final


@pytest.mark.parametrize("trim", [True, False])
def test_responses_aborted_non_stream_is_trimmed_at_the_onset(trim: bool) -> None:
    whole = (STREAMS / "responses_vllm_loop.sse").read_bytes()
    g = guard("responses", collect=True)
    g.feed(whole)
    resp = g.response(trim=trim)
    verdict = g.choices[0].verdict
    assert verdict is not None
    streamed = "".join(e["delta"] for n, e in events_of(whole) if n.endswith("text.delta"))
    full = streamed[: verdict.fired_at_char]
    [item] = resp["output"]
    assert item["content"][0]["text"] == (full[: verdict.onset_char] if trim else full)
    assert resp["status"] == "incomplete"
    assert resp["incomplete_details"]["guard"]["onset_char"] == verdict.onset_char


def test_messages_healthy_non_stream_matches_the_engines_answer() -> None:
    """The Message rebuilt from vLLM's stream has the content, stop reason and usage of the
    engine's own non-streamed answer to the same request (recorded alongside)."""
    whole = (STREAMS / "messages_vllm.sse").read_bytes()
    g = guard("messages", collect=True)
    g.feed(whole)
    got = g.response(trim=True)
    engine = {  # POST /v1/messages without "stream", same request, vLLM 0.32
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "Hello, welcome to my world!"}],
        "model": "SmolLM2-135M-Instruct",
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 36, "output_tokens": 8},
    }
    assert list(got) == ["id", *engine]
    assert {k: v for k, v in got.items() if k != "id"} == engine


@pytest.mark.parametrize("trim", [True, False])
def test_messages_aborted_non_stream_is_trimmed_and_says_why(trim: bool) -> None:
    whole = (STREAMS / "messages_vllm_loop.sse").read_bytes()
    g = guard("messages", collect=True)
    g.feed(whole)
    got = g.response(trim=trim)
    verdict = g.choices[0].verdict
    assert verdict is not None
    streamed = "".join(
        e["delta"]["text"] for n, e in events_of(whole) if n == "content_block_delta"
    )
    full = streamed[: verdict.fired_at_char]
    assert got["content"] == [
        {"type": "text", "text": full[: verdict.onset_char] if trim else full}
    ]
    assert got["stop_reason"] == "refusal"
    assert got["guard"]["signal"] == verdict.signal
    assert got["stop_details"]["explanation"] == "coherence_guard:" + verdict.signal


def test_messages_non_stream_rebuilds_thinking_text_and_tool_use_blocks() -> None:
    script = Script(texts=["Calling."], reasoning="Need a tool.", tool_call=("f", '{"a": 1}'))
    g = guard("messages", collect=True)
    g.feed(fake_stream("messages", script, max_tokens=100))
    got = g.response(trim=True)
    assert got["content"] == [
        {"type": "thinking", "thinking": "Need a tool.", "signature": ""},
        {"type": "text", "text": "Calling."},
        {"type": "tool_use", "id": "toolu_fake0", "name": "f", "input": {"a": 1}},
    ]
    assert got["stop_reason"] == "tool_use"


def test_response_refuses_another_surfaces_name() -> None:
    g = guard("messages")
    with pytest.raises(ValueError, match="messages"):
        g.response("chat", trim=True)  # type: ignore[arg-type]
