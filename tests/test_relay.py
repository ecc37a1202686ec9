"""The stream guard (pure): bytes in, bytes out, abort decisions — no sockets involved."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.core.guard import GuardPolicy, StreamGuard
from proxy.detect import Detector
from tests.fakes.vllm import FakeVLLM, Script

STREAMS = sorted((Path(__file__).parent / "streams").glob("*.sse"))
CORPUS = [
    json.loads(line)
    for line in (Path(__file__).parent / "data" / "corpus.jsonl").read_text().splitlines()
]
DEGENERATE = [r for r in CORPUS if r["label"] == "degenerate"]
HEALTHY = [r for r in CORPUS if r["label"] == "healthy"]
#: An exact loop no reasonable detector lets through.
LOOP = "The answer is the answer. " * 200


def guard(**kw: Any) -> StreamGuard:
    make_detector = kw.pop("make_detector", Detector)
    return StreamGuard(GuardPolicy.create(**kw), make_detector)


def stream(
    texts: list[str], *, chat: bool = True, usage: bool = True, n: int = 1, **kw: Any
) -> bytes:
    req: dict[str, Any] = {"model": "m", "stream": True, "n": n}
    if usage:
        req["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    events = FakeVLLM()._events(req, chat, Script(texts=texts, **kw))
    return b"".join(e for e in events if e is not None)


def events_of(data: bytes) -> list[Any]:
    out = []
    for block in data.split(b"\n\n"):
        if block.startswith(b"data: ") and block != b"data: [DONE]":
            out.append(orjson.loads(block[6:]))
    return out


@pytest.mark.parametrize("path", STREAMS, ids=lambda p: p.name)
def test_healthy_recorded_stream_passes_byte_identical(path: Path) -> None:
    whole = path.read_bytes()
    g = guard(n=2 if "n2" in path.name else 1)
    out = g.feed(whole) + g.eof()
    assert out == whole
    assert g.outcome() == "completed"


@pytest.mark.parametrize("path", STREAMS, ids=lambda p: p.name)
def test_every_byte_boundary_gives_identical_output(path: Path) -> None:
    """With usage stripping on (every chunk rewritten), any split of the upstream bytes gives
    the same client bytes as the unsplit stream."""
    whole = path.read_bytes()
    n = 2 if "n2" in path.name else 1

    def run(pieces: list[bytes]) -> bytes:
        g = guard(n=n, strip_chunk_usage=True, strip_final_usage=True, client_wants_usage=False)
        return b"".join(g.feed(p) for p in pieces) + g.eof()

    expected = run([whole])
    for cut in range(1, len(whole)):
        assert run([whole[:cut], whole[cut:]]) == expected, cut


def test_every_byte_boundary_of_an_aborted_stream_gives_identical_output() -> None:
    events = stream(["Sure. " + LOOP]).split(b"\n\n")
    whole = b"\n\n".join(events[:80]) + b"\n\n"  # the guard fires well before event 80
    expected_guard = guard()
    expected = expected_guard.feed(whole)
    assert expected_guard.aborted
    step = (
        7  # every boundary of a 40 kB stream is slow; a prime stride still hits all offsets mod 7
    )
    for cut in range(1, len(whole), step):
        g = guard()
        out = g.feed(whole[:cut])
        if not g.done:
            out += g.feed(whole[cut:])
        assert out == expected, cut


def test_usage_the_client_did_not_ask_for_is_removed() -> None:
    whole = stream(["Hello world, a healthy answer."])
    g = guard(strip_chunk_usage=True, strip_final_usage=True, client_wants_usage=False)
    out = g.feed(whole) + g.eof()
    sent = events_of(out)
    original = events_of(whole)
    assert all("usage" not in e for e in sent)
    assert sent == [{k: v for k, v in e.items() if k != "usage"} for e in original if e["choices"]]
    assert out.endswith(b"data: [DONE]\n\n")
    assert g.usage is not None and g.usage["completion_tokens"] == len(sent) - 2


def test_final_usage_is_kept_when_the_client_asked() -> None:
    whole = stream(["Hello world."])
    g = guard(strip_chunk_usage=True, strip_final_usage=False)
    sent = events_of(g.feed(whole))
    assert sent[-1]["choices"] == [] and sent[-1]["usage"]["completion_tokens"] == 2
    assert all("usage" not in e for e in sent[:-1])


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize("finish", ["content_filter", "length", "stop", "repetition"])
def test_abort_ends_the_choice_then_usage_then_done(chat: bool, finish: str) -> None:
    whole = stream(["Sure. " + LOOP], chat=chat)
    g = guard(abort_finish_reason=finish, strip_chunk_usage=True, client_wants_usage=True)
    out = g.feed(whole)
    assert g.done and g.aborted and g.outcome() == "aborted"
    assert out.endswith(b"data: [DONE]\n\n")
    sent = events_of(out)
    last, usage = sent[-2], sent[-1]
    [choice] = last["choices"]
    assert choice["finish_reason"] == finish
    signal = choice["guard"]["signal"]
    assert choice["stop_reason"] == f"coherence_guard:{signal}"
    assert choice["guard"]["action"] == "aborted"
    assert isinstance(choice["guard"]["score"], float | int)
    assert 0 <= choice["guard"]["onset_char"] <= len("Sure. " + LOOP)
    assert choice["guard"]["completion_tokens"] == usage["usage"]["completion_tokens"]
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == 7
    # Stopped early: far fewer tokens than the stream had.
    assert usage["usage"]["completion_tokens"] < 400
    [record] = g.records(100)
    assert record.finish_reason == finish and record.detection_action == "aborted"


def test_abort_without_usage_request_sends_no_usage_chunk() -> None:
    g = guard(strip_chunk_usage=True, strip_final_usage=True, client_wants_usage=False)
    sent = events_of(g.feed(stream(["Sure. " + LOOP])))
    assert sent[-1]["choices"][0]["finish_reason"] == "content_filter"
    assert all("usage" not in e for e in sent)


@pytest.mark.parametrize("row", DEGENERATE, ids=lambda r: r["id"][:40])
def test_degenerate_corpus_texts_are_aborted(row: dict[str, Any]) -> None:
    g = guard()
    g.feed(stream([row["text"]]))
    assert g.aborted


@pytest.mark.parametrize("row", HEALTHY, ids=lambda r: r["id"][:40])
def test_healthy_corpus_texts_pass_unchanged(row: dict[str, Any]) -> None:
    whole = stream([row["text"]])
    g = guard()
    assert g.feed(whole) + g.eof() == whole


def test_monitor_mode_observes_but_changes_nothing() -> None:
    whole = stream(["Sure. " + LOOP])
    g = guard(mode="monitor")
    assert g.feed(whole) + g.eof() == whole
    [record] = g.records(None)
    assert record.detection_action == "observed"
    assert record.summary is not None and record.summary.verdict is not None
    assert g.outcome() == "completed"


def test_n2_one_looping_choice_ends_alone() -> None:
    healthy = HEALTHY[0]["text"][:600]
    whole = stream([healthy, "Well. " + LOOP], n=2)
    g = guard(n=2, strip_chunk_usage=True, client_wants_usage=True)
    out = g.feed(whole)
    sent = events_of(out)
    by_index: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    for e in sent:
        for c in e["choices"]:
            by_index[c["index"]].append(c)
    text0 = "".join(c["delta"].get("content", "") for c in by_index[0])
    assert text0 == healthy
    assert by_index[0][-1]["finish_reason"] == "stop"
    ends1 = [c for c in by_index[1] if c["finish_reason"] is not None]
    assert len(ends1) == 1 and ends1[0] is by_index[1][-1]
    assert ends1[0]["finish_reason"] == "content_filter"
    assert g.done and out.endswith(b"data: [DONE]\n\n")
    assert sent[-1]["usage"]["completion_tokens"] == sum(s.tokens for s in g.choices.values())


def test_n2_stream_ends_as_soon_as_no_live_choice_remains() -> None:
    """When the healthy choice finishes while the aborted one would still run, the guard ends
    the stream (and the app closes the upstream) instead of reading the loop to the end."""
    whole = stream(["Short.", "Well. " + LOOP], n=2)
    g = guard(n=2)
    g.feed(whole)
    assert g.done and not g.saw_done


def test_upstream_error_event_is_relayed() -> None:
    whole = stream(["one two three four five six"], mid_stream_error=3)
    g = guard()
    out = g.feed(whole)
    assert b'"error"' in out and out.endswith(b"data: [DONE]\n\n")
    assert g.outcome() == "upstream_error"


def test_stream_cut_without_done_ends_with_error_event_and_done() -> None:
    whole = stream(["one two three"])
    cut = whole.index(b"data: [DONE]") - 30
    g = guard()
    out = g.feed(whole[:cut]) + g.eof()
    tail = out[-200:]
    assert b'"error"' in tail and out.endswith(b"data: [DONE]\n\n")
    # The half event was not forwarded: every event the client got is complete JSON.
    assert all(isinstance(e, dict) for e in events_of(out))
    assert g.outcome() == "upstream_error"


def test_non_streaming_response_is_reassembled() -> None:
    whole = stream(["Hello world, fine."], reasoning="Thinking first.", tool_call=("f", '{"a": 1}'))
    g = guard(collect=True)
    g.feed(whole)
    resp = g.response("chat", trim=True)
    [choice] = resp["choices"]
    assert resp["object"] == "chat.completion"
    assert choice["message"]["content"] == "Hello world, fine."
    assert choice["message"]["reasoning"] == "Thinking first."
    assert choice["message"]["tool_calls"] == [
        {
            "id": "chatcmpl-tool-1",
            "type": "function",
            "function": {"name": "f", "arguments": '{"a": 1}'},
        }
    ]
    assert choice["finish_reason"] == "stop"
    assert resp["usage"]["completion_tokens"] == g.usage["completion_tokens"]  # type: ignore[index]


@pytest.mark.parametrize("trim", [True, False])
def test_non_streaming_abort_trims_from_onset(trim: bool) -> None:
    prefix = "Here is my answer. "
    g = guard(collect=True, endpoint="completions")
    g.feed(stream([prefix + LOOP], chat=False))
    resp = g.response("completions", trim=trim)
    [choice] = resp["choices"]
    onset = choice["guard"]["onset_char"]
    fired = g.choices[0].verdict.fired_at_char  # type: ignore[union-attr]
    full = (prefix + LOOP)[:fired]
    assert choice["text"] == (full[:onset] if trim else full)
    assert choice["finish_reason"] == "content_filter"
    assert resp["object"] == "text_completion"


@pytest.mark.parametrize("mode", ["enforce", "monitor"])
@pytest.mark.parametrize("mapped", ["content_filter", "length", "stop"])
def test_engine_repetition_stop_is_shown_as_the_configured_finish_reason(
    mode: str, mapped: str
) -> None:
    """vLLM's own repetition_detection ends a choice with finish_reason "repetition"; the client
    sees GUARD_ABORT_FINISH_REASON, the engine's stop_reason stays, metrics keep "repetition"."""
    whole = stream(["A short answer."], finish_reason="repetition")
    g = guard(mode=mode, abort_finish_reason=mapped, collect=True)
    sent = events_of(g.feed(whole) + g.eof())
    finishes = [c["finish_reason"] for e in sent for c in e["choices"] if c["finish_reason"]]
    assert finishes == [mapped]
    assert g.response("chat", trim=True)["choices"][0]["finish_reason"] == mapped
    [record] = g.records(100)
    assert record.finish_reason == "repetition"


@pytest.mark.parametrize(("mode", "mapped"), [("off", "content_filter"), ("enforce", "repetition")])
def test_engine_repetition_stop_passes_untouched_when_nothing_maps_it(
    mode: str, mapped: str
) -> None:
    whole = stream(["A short answer."], finish_reason="repetition")
    g = guard(mode=mode, abort_finish_reason=mapped)
    assert g.feed(whole) + g.eof() == whole
