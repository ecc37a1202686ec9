"""Drift after a correct start: real answers that begin in the requested language and leave it
mid-sentence or mid-list, and whether the detector catches them.

    python bench/measure/language/measure_drift.py           # figures (minutes on one core)
    python bench/measure/language/measure_drift.py --misses  # also print each miss
    # the same splices through another version:
    MEASURE_PROXY_ROOT=/path/to/other/checkout python bench/measure/language/measure_drift.py

The start is a real healthy text in language L (``measure_language.py``'s corpus texts and
real-engine answers, lists and Markdown included) cut after 150 to 600 characters at one of:

* ``line``: a line end; ``sentence``: a sentence end; ``mid``: inside a sentence, at a word
  boundary (the model changes language in the middle of a clause);
* ``list``: after a whole list item; ``mid-list``: inside a list item, after its marker and a
  few words (a list the model goes on in English).

The tail is a real English model answer (a quarter of them Chinese, for languages other than
Chinese and Japanese), either whole, or — the way a drifting model goes on — from one of its
list items (for the list cuts) or from inside one of its sentences (for ``mid``), and either as
long as it is (``long``) or cut to 150 to 400 characters (``short``: the answer ends soon after
it drifts, as length-capped benchmark answers do). The expectation is the one the default
settings derive from a question of our own in L (``measure_language.QUESTIONS``). Every
splice is streamed through the real ``Detector`` (``finish()`` included, as for a
non-streamed answer) and counts as caught on any verdict.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections import Counter
from typing import Any

from measure_language import ANSWERS, QUESTIONS, expectation, load_texts, verdict

#: A list item's marker at the start of a line: "- ", "* ", "• ", "1. ", "2) ".
_ITEM = re.compile(r"^[ \t]*(?:[-*•]|\d{1,2}[.)、]|[（(]?\d{1,2}[)）])[ \t]+", re.M)
_SENTENCE_END = ".。!?！？"
CUTS = ("line", "sentence", "mid", "list", "mid-list")
LOW, HIGH = 150, 600


def cut_start(text: str, kind: str, rng: random.Random) -> str | None:
    """The start of ``text`` (LOW to HIGH characters) cut as ``kind`` says, or None."""
    high = min(HIGH, len(text) - 20)
    if high <= LOW:
        return None
    if kind == "line":
        cuts = [i + 1 for i, c in enumerate(text[:high]) if c == "\n" and i + 1 >= LOW]
    elif kind == "sentence":
        cuts = [i + 1 for i, c in enumerate(text[:high]) if c in _SENTENCE_END and i + 1 >= LOW]
    elif kind == "mid":
        # Inside a sentence of prose (not a list line): after a space, or any character in a
        # script written without spaces, with a letter on each side.
        cuts = [
            i
            for i in range(LOW, high)
            if (text[i - 1].isalpha() and text[i].isalpha())
            or (text[i - 1] == " " and text[i].isalpha())
        ]
        cuts = [i for i in cuts if not _ITEM.match(text, text.rfind("\n", 0, i) + 1)]
    else:
        items = [m for m in _ITEM.finditer(text, 0, high) if m.end() >= LOW // 2]
        if kind == "list":
            # After a whole item: at the end of an item line that another item follows.
            cuts = [m.start() for m in items if m.start() >= LOW]
        else:
            cuts = []
            for m in items:
                line_end = text.find("\n", m.end())
                line_end = len(text) if line_end < 0 else line_end
                inside = [i for i in range(m.end() + 8, min(line_end, high)) if text[i - 1] == " "]
                cuts += [i for i in inside if i >= LOW]
    return text[: rng.choice(cuts)] if cuts else None


def tail_from(answer: str, kind: str, rng: random.Random) -> str:
    """The English (or Chinese) answer as the drifting model goes on after a ``kind`` cut."""
    if kind in ("list", "mid-list"):
        items = [m.start() for m in _ITEM.finditer(answer)]
        if items:
            start = rng.choice(items)
            if kind == "mid-list":
                # Goes on inside the item: drop its marker and first word or two.
                marker = _ITEM.match(answer, start)
                assert marker is not None
                rest = answer[marker.end() :].split(" ", rng.randint(1, 2))
                return " ".join(rest[-1:]) if len(rest) > 1 else answer[marker.end() :]
            return answer[start:]
    if kind == "mid":
        spaces = [i + 1 for i, c in enumerate(answer[:400]) if c == " "]
        if spaces:
            return answer[rng.choice(spaces) :]
    return answer


def measure(show: bool) -> dict[str, Any]:
    rng = random.Random(11)
    by_lang, _ = load_texts()
    english = ANSWERS["en"]
    chinese = ANSWERS["zh"]
    caught: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for lang, texts in sorted(by_lang.items()):
        if lang == "en" or lang not in QUESTIONS:
            continue
        for text in texts:
            expected = expectation(rng.choice(QUESTIONS[lang]))
            for kind in CUTS:
                start = cut_start(text, kind, rng)
                if start is None:
                    continue
                pool = chinese if (lang not in ("zh", "ja") and rng.random() < 0.25) else english
                tail = tail_from(rng.choice(pool), kind, rng)
                for length in ("long", "short"):
                    body = tail if length == "long" else tail[: rng.randint(150, 400)]
                    key = f"{kind}/{length}"
                    total[key] += 1
                    total[f"lang {lang}"] += 1
                    if verdict(start + body, expected) is not None:
                        caught[key] += 1
                        caught[f"lang {lang}"] += 1
                    elif show:
                        print(f"  missed {lang} {key}: ...{start[-60:]!r} | {body[:80]!r}")
    keys = [f"{k}/{n}" for k in CUTS for n in ("long", "short")]
    out: dict[str, Any] = {
        "answers": sum(total[k] for k in keys),
        "caught": sum(caught[k] for k in keys),
    }
    out["rate"] = round(out["caught"] / max(1, out["answers"]), 3)
    out["by_cut"] = {k: f"{caught[k]}/{total[k]}" for k in keys}
    out["by_language"] = {
        k.split()[1]: f"{caught[k]}/{total[k]}" for k in sorted(total) if k.startswith("lang ")
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--misses", action="store_true", help="print what was missed")
    args = parser.parse_args()
    print(json.dumps(measure(args.misses), indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
