"""Channels judged in their own registers (proxy/core/channels.py), on the engine's own reasoning
framing: streams recorded from vLLM's reasoning parser (tests/streams/reasoning/) with real
thinking and answer texts spliced in (tests/reasoning_streams.py).

A reasoning model thinks in English whatever the question's language: the thinking must never
be judged against the answer's expected language, while a loop in it is still caught, and the
answer is still judged as it always was.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.core import channels
from proxy.core.channels import SideChannels
from proxy.core.guard import GuardPolicy, StreamGuard
from proxy.core.heal import HealGuard
from proxy.core.heal_request import HealPolicy
from proxy.core.records import GenerationRecord
from proxy.detect import Detector, DetectorConfig, Verdict
from proxy.observability.metrics import Metrics
from tests.exposition_server import parse, value
from tests.reasoning_streams import SURFACES, build, loop, texts

TEXTS = texts()
ANSWERS = [key for key, row in TEXTS.items() if row["lang"] != "en"]
THINKING = "alpaca-claude-3-5-sonnet-20240620-758"
ENGLISH_ANSWER = "alpaca-claude-3-5-sonnet-20240620-17"


def relay(
    surface: str, raw: bytes, language: str, *, collect: bool = False
) -> tuple[StreamGuard, bytes]:
    policy = GuardPolicy.create(endpoint=surface, mode="enforce", collect=collect)  # type: ignore[arg-type]
    guard = StreamGuard(policy, lambda: Detector(expected_language=language))
    # One upstream read per event, as the engine sends them.
    out = b"".join(guard.feed(block + b"\n\n") for block in raw.split(b"\n\n") if block)
    return guard, out + guard.eof()


def events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for block in raw.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: {"):
                out.append(json.loads(line[6:]))
    return out


def verdicts(guard: StreamGuard) -> list[Verdict]:
    return [st.verdict for st in guard.choices.values() if st.verdict is not None]


def guard_object(surface: str, out: bytes) -> dict[str, Any]:
    last = events(out)
    if surface == "chat":
        return next(c["guard"] for e in last for c in e.get("choices", []) if "guard" in c)
    if surface == "responses":
        return last[-1]["response"]["incomplete_details"]["guard"]  # type: ignore[no-any-return]
    return last[-2]["delta"]["guard"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize("surface", SURFACES)
def test_english_thinking_before_a_foreign_answer_passes_byte_identical(
    surface: str, answer: str
) -> None:
    row = TEXTS[answer]
    raw = build(surface, TEXTS[THINKING]["text"], row["text"])
    guard, out = relay(surface, raw, row["lang"])
    assert out == raw
    assert verdicts(guard) == []
    assert guard.outcome() == "completed"
    [*records] = guard.records(None)
    assert all(r.summary is not None and r.summary.verdict is None for r in records)


@pytest.mark.parametrize("surface", SURFACES)
def test_a_loop_inside_the_thinking_is_still_caught(surface: str) -> None:
    thinking = loop(TEXTS[THINKING]["text"])
    raw = build(surface, thinking, TEXTS["lcb-mistral-large-de-okapi-95"]["text"])
    guard, out = relay(surface, raw, "de")
    assert guard.outcome() == "aborted"
    [verdict] = verdicts(guard)
    assert verdict.channel == "reasoning"
    assert verdict.signal in ("repetition", "near-repetition")
    # The onset lies where the loop begins, in the thinking (thinking comes first in the block).
    assert 300 <= verdict.onset_char <= 600
    obj = guard_object(surface, out)
    assert obj["channel"] == "reasoning" and obj["signal"] == verdict.signal
    # The answer never started: nothing of it reached the client.
    assert "Cloud Computing" not in out.decode()


@pytest.mark.parametrize("surface", SURFACES)
def test_a_wrong_language_answer_after_thinking_is_still_caught(surface: str) -> None:
    thinking = TEXTS[THINKING]["text"]
    raw = build(surface, thinking, TEXTS[ENGLISH_ANSWER]["text"])
    guard, out = relay(surface, raw, "de")
    assert guard.outcome() == "aborted"
    [verdict] = verdicts(guard)
    assert (verdict.signal, verdict.channel) == ("language-drift", "content")
    if surface == "responses":
        # The answer is its own output item (its own block): the onset counts from its start.
        assert verdict.onset_char < len(TEXTS[ENGLISH_ANSWER]["text"])
    else:
        # The answer's onset, in the block's whole text: after all of the thinking.
        assert verdict.onset_char >= len(thinking)
    assert guard_object(surface, out)["channel"] == "content"


def test_the_same_english_answer_is_fine_when_english_is_expected() -> None:
    raw = build("chat", TEXTS[THINKING]["text"], TEXTS[ENGLISH_ANSWER]["text"])
    guard, out = relay("chat", raw, "en")
    assert out == raw and verdicts(guard) == []


def test_non_streamed_chat_answer_is_trimmed_inside_the_thinking() -> None:
    thinking = loop(TEXTS[THINKING]["text"])
    raw = build("chat", thinking, TEXTS["lcb-mistral-large-de-okapi-95"]["text"])
    guard, _ = relay("chat", raw, "de", collect=True)
    [verdict] = verdicts(guard)
    answer = guard.response(trim=True)
    [choice] = answer["choices"]
    assert choice["message"]["reasoning"] == thinking[: verdict.onset_char]
    assert choice["message"]["content"] is None
    assert choice["guard"]["channel"] == "reasoning"


def test_a_verdict_in_the_thinking_is_not_healed() -> None:
    """Heal continues an answer from its kept text (``continue_final_message``); it cannot
    continue a cut thought, so a loop in the thinking ends the choice as ``enforce`` would."""
    thinking = loop(TEXTS[THINKING]["text"])
    raw = build("chat", thinking, TEXTS["lcb-mistral-large-de-okapi-95"]["text"])
    policy = GuardPolicy.create(endpoint="chat", mode="heal")
    guard = HealGuard(policy, lambda: Detector(expected_language="de"), HealPolicy())
    out = b"".join(guard.feed(block + b"\n\n") for block in raw.split(b"\n\n") if block)
    assert guard.needs_heal and not guard.healable
    out += guard.give_up()
    sent = events(out)
    reasoning = "".join(
        c["delta"].get("reasoning") or "" for e in sent for c in e.get("choices", [])
    )
    [verdict] = verdicts(guard)
    # The client got the thinking up to heal's cut (the onset, or what the hold-back window
    # had already released past it), none of the loop the window held, and no answer text.
    assert guard.cut is not None and verdict.onset_char <= guard.cut < verdict.fired_at_char
    assert reasoning == thinking[: guard.cut]
    assert all(not (c["delta"].get("content") or "") for e in sent for c in e.get("choices", []))
    final = next(c for e in sent for c in e.get("choices", []) if "guard" in c)
    assert final["guard"]["channel"] == "reasoning"
    assert final["stop_reason"] == "coherence_guard:" + verdict.signal
    [record] = guard.records(None)
    assert record.summary is not None and record.summary.verdict is not None
    assert record.summary.verdict.channel == "reasoning"


def test_metrics_count_the_channel_a_verdict_fired_on() -> None:
    thinking = loop(TEXTS[THINKING]["text"])
    raw = build("messages", thinking, TEXTS["lcb-mistral-large-de-okapi-95"]["text"])
    guard, _ = relay("messages", raw, "de")
    metrics = Metrics(max_models=3)
    metrics.record_generation(
        GenerationRecord("m", "messages", guard.outcome(), guard.records(None))
    )
    q = parse(metrics.render_quality()[0])
    name = "guard_channel_detections_total"
    assert value(q, name, model="m", channel="reasoning", action="aborted") == 1
    assert value(q, name, model="m", channel="content", action="aborted") == 0


def test_tool_arguments_are_judged_without_the_answers_language() -> None:
    """Tool-call arguments are JSON in no natural language: English strings in them never count
    as drift from a German answer, while the answer around them is still judged."""
    args = json.dumps({"query": TEXTS[ENGLISH_ANSWER]["text"]})
    german = TEXTS["lcb-mistral-large-de-okapi-95"]["text"]
    guard = StreamGuard(GuardPolicy.create(), lambda: Detector(expected_language="de"))
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, Any]) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return b"data: " + json.dumps({**head, "choices": [choice]}).encode() + b"\n\n"

    out = guard.feed(chunk({"role": "assistant", "content": ""}))
    for word in german.split(" "):
        out += guard.feed(chunk({"content": word + " "}))
    call = {"index": 0, "id": "t", "type": "function", "function": {"name": "f", "arguments": ""}}
    out += guard.feed(chunk({"tool_calls": [call]}))
    for i in range(0, len(args), 6):
        part = {"index": 0, "function": {"arguments": args[i : i + 6]}}
        out += guard.feed(chunk({"tool_calls": [part]}))
    assert verdicts(guard) == []
    side = guard.choices[0].side
    assert side is not None and list(side.detectors) == ["tool"]


def test_side_channel_offsets_map_back_to_the_block() -> None:
    """Channels may interleave; each channel's own offsets map to the block's whole text."""
    side = SideChannels(DetectorConfig())
    # content [0, 10), reasoning [10, 30), content [30, 40), tool [40, 45), reasoning [45, 50)
    side.note("reasoning", 10, 20)
    side.note("tool", 40, 5)
    side.note("reasoning", 45, 5)
    assert [side.to_block("content", i) for i in (0, 9, 10, 19, 20)] == [0, 9, 30, 39, 50]
    assert [side.to_block("reasoning", i) for i in (0, 19, 20, 24)] == [10, 29, 45, 49]
    assert side.to_block("tool", 3) == 43
    assert channels.channel_of("thinking_delta") == "reasoning"
    assert channels.channel_of("reasoning_content") == "reasoning"
    assert channels.channel_of("input_json_delta") == "tool"
    assert channels.channel_of("text") == "content"


def test_the_thinking_register_keeps_every_signal_but_the_language_ones() -> None:
    cfg = channels.side_config(DetectorConfig())
    assert not (cfg.language_drift or cfg.salad or cfg.script)
    assert cfg.repetition and cfg.line_loop and cfg.ngram and cfg.diversity and cfg.compression
