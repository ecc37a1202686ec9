"""The memo of request texts (:class:`proxy.core.requested_language.TextMemo`): a text read a
moment ago gets the expectation that reading it again would give, without reading it again, and
the memo keeps digests, never the text, and a bounded number of them."""

from __future__ import annotations

import pytest

import proxy.core.requested_language as rl
from proxy.core.requested_language import MEMO, TextMemo, derive

# Prompts of every kind the derivation tells apart: instructions, subjects, scripts, short
# Latin prompts, conflicts, translations without a target, English, nothing to tell.
PROMPTS = [
    "Write a long story about a proxy.",
    "Reply in French. Explain how a bicycle works.",
    "Explain the difference between por and para in Spanish.",
    "Wie funktioniert ein Fahrrad? Bitte ausführlich.",
    "自転車はどのように動きますか？",
    "Как работает велосипед?",
    "Як працює велосипед?",
    "Translate this: good morning",
    "Answer in German and in Italian.",
    "Ciao, come stai?",
    "12345 ... ---",
    "",
]
SYSTEMS = [[], ["You are a helpful assistant. Always answer in English."], ["Réponds en français."]]


@pytest.fixture(autouse=True)
def _fresh_memo() -> None:
    MEMO.clear()


def expect(system: list[str], prompt: str) -> rl.Expectation:
    return derive([*(("system", t) for t in system), ("user", prompt)])


def _uncached(system: list[str], prompt: str) -> rl.Expectation:
    MEMO.clear()
    return expect(system, prompt)


@pytest.mark.parametrize("system", SYSTEMS)
def test_a_text_seen_before_gets_the_same_expectation(system: list[str]) -> None:
    fresh = {p: _uncached(system, p) for p in PROMPTS}
    MEMO.clear()
    for _ in range(2):  # first from reading, then from the memo
        for prompt in PROMPTS:
            assert expect(system, prompt) == fresh[prompt], prompt


def test_a_text_seen_before_is_not_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real_read, real_language, real_turn = rl.read, rl.prompt_language, rl.turn_languages
    monkeypatch.setattr(
        rl, "read", lambda text, language=None: calls.append("read") or real_read(text, language)
    )
    monkeypatch.setattr(
        rl, "prompt_language", lambda text: calls.append("language") or real_language(text)
    )
    monkeypatch.setattr(rl, "turn_languages", lambda text: calls.append("turn") or real_turn(text))
    system = ["You are a helpful assistant."]
    first = expect(system, "Wie funktioniert ein Fahrrad?")
    assert calls == ["language", "read", "language", "read", "turn"]
    calls.clear()
    assert expect(system, "Wie funktioniert ein Fahrrad?") == first
    expect(system, "Write a poem.")
    # the system prompt is answered from the memo; only the new user turn is read
    assert calls == ["language", "read", "turn"]


def test_the_memo_keeps_digests_never_text_and_a_bounded_number() -> None:
    memo = TextMemo(size=8)
    texts = [f"Please write story number {i} about a lighthouse keeper." for i in range(20)]
    for text in texts:
        memo.language(text)
    assert len(memo) == 8
    assert all(isinstance(k, bytes) and len(k) == 16 for k in memo.digests())
    # the least recently used goes first: of the last eight, the one used again stays
    memo.language(texts[-8])
    memo.language("one more text that pushes out the oldest")
    kept = set(memo.digests())
    again = TextMemo(size=8)
    for text in texts[-8:]:
        again.language(text)
    assert len(kept & set(again.digests())) == 7
    held = repr([(s.reading, s.language) for s in memo._entries.values()])
    assert "lighthouse" not in held


def test_words_scored_before_are_not_searched_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A short prompt's words are scored against every word list once; the next prompt made of
    the same words gets the same judgement from the cached scores."""
    from proxy.detect import word_language as wl
    from proxy.detect.language import classify_top, strip_noise

    prompt = strip_noise("Wat is fotosynthese precies?")
    top = classify_top(prompt, 5)
    wl._word_scores.cache_clear()
    searched: list[int] = []
    real = wl.Frequencies.zipf_of
    monkeypatch.setattr(
        wl.Frequencies, "zipf_of", lambda self, h: searched.append(h) or real(self, h)
    )
    first = wl.identify_by_words(prompt, top)
    cold = len(searched)
    searched.clear()
    assert wl.identify_by_words(prompt, top) == first
    assert cold > 4 * len(wl._listed()) and len(searched) < cold / 10
