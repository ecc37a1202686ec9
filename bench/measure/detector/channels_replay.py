"""Replay reasoning streams through the guard: how many healthy ones it cuts, how many loops in
the thinking it still catches.

Streams are vLLM's own reasoning framing (tests/streams/reasoning/, recorded from the engine)
with real texts of the development corpus spliced in (tests/reasoning_streams.py):

* healthy: English thinking (a healthy English answer of the corpus, up to 4,000 characters)
  before each healthy de/fr/es/ru/zh answer of the corpus, the request expecting the answer's
  language — what a reasoning model asked in that language writes. Each pair on chat, Responses
  and Messages.
* English: the same thinking before a healthy English answer, English expected.
* answer alone: each de/fr/es/ru/zh answer without thinking (the floor: what the answer's own
  judgement cuts, unchanged by channels).
* loops: each degenerate English text of the corpus (real model loops and floods) as the
  thinking, before a healthy answer; and for reference the same texts as an English answer.

Run with the code under test first on ``PYTHONPATH`` (e.g. an older ``proxy`` exported
with ``git archive`` to compare)::

    python bench/measure/detector/channels_replay.py [--corpus ../shared/corpus/dev.jsonl] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[3]))  # after PYTHONPATH: it picks `proxy`

from proxy.core.guard import GuardPolicy, StreamGuard
from proxy.detect import Detector
from tests.reasoning_streams import SURFACES, build

LANGUAGES = ("de", "fr", "es", "ru", "zh")
THINKING_CHARS = 4000


def replay(surface: str, raw: bytes, language: str) -> tuple[bool, str | None, str | None]:
    """(cut, signal, channel) for one stream relayed in enforce mode."""
    policy = GuardPolicy.create(endpoint=surface, mode="enforce")  # type: ignore[arg-type]
    guard = StreamGuard(policy, lambda: Detector(expected_language=language))
    for block in raw.split(b"\n\n"):
        if block and not guard.done:
            guard.feed(block + b"\n\n")
    guard.eof()
    verdict = next((s.verdict for s in guard.choices.values() if s.verdict is not None), None)
    if verdict is None:
        return False, None, None
    return guard.aborted, verdict.signal, getattr(verdict, "channel", "content")


def trim(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return text[: cut if cut > limit // 2 else limit]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    root = Path(__file__).resolve().parents[3]
    ap.add_argument("--corpus", default=str(root.parent / "shared" / "corpus" / "dev.jsonl"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [json.loads(line) for line in Path(args.corpus).read_text().splitlines()]
    healthy = [r for r in rows if r["label"] == "healthy"]
    answers = [r for r in healthy if r["lang"] in LANGUAGES]
    thinking = [
        trim(r["text"], THINKING_CHARS)
        for r in healthy
        if r["lang"] == "en" and r["kind"] == "llm-answer" and len(r["text"]) >= 1500
    ]
    english = [
        r
        for r in healthy
        if r["lang"] == "en" and r["kind"] == "llm-answer" and len(r["text"]) < 1500
    ]
    loops = [r for r in rows if r["label"] == "degenerate" and r["lang"] == "en"]
    out: dict[str, Any] = {}

    def tally(name: str, results: list[tuple[bool, str | None, str | None]]) -> None:
        cut = [r for r in results if r[0]]
        out[name] = {
            "streams": len(results),
            "cut": len(cut),
            "by_signal": dict(Counter(f"{r[2]}:{r[1]}" for r in cut)),
        }

    for surface in SURFACES:
        tally(
            f"healthy {surface}",
            [
                replay(surface, build(surface, thinking[i % len(thinking)], a["text"]), a["lang"])
                for i, a in enumerate(answers)
            ],
        )
    tally(
        "english chat",
        [
            replay("chat", build("chat", thinking[i % len(thinking)], e["text"]), "en")
            for i, e in enumerate(english[:100])
        ],
    )
    tally(
        "answer alone chat",
        [replay("chat", build("chat", "", a["text"]), a["lang"]) for a in answers],
    )
    tally(
        "loops in thinking chat",
        [
            replay(
                "chat",
                build("chat", r["text"], answers[i % len(answers)]["text"]),
                answers[i % len(answers)]["lang"],
            )
            for i, r in enumerate(loops)
        ],
    )
    tally(
        "loops as english answer chat",
        [replay("chat", build("chat", "", r["text"]), "en") for r in loops],
    )
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for name, row in out.items():
        share = 100 * row["cut"] / max(1, row["streams"])
        counts = f"{row['cut']:4d} / {row['streams']:4d} cut ({share:5.1f} %)"
        print(f"{name:32s} {counts}  {row['by_signal']}")


if __name__ == "__main__":
    main()
