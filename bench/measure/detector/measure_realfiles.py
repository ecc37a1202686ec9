"""The detector on real files of the kinds models write: every verdict is a false alarm.

``bench/data/realfiles.jsonl.gz`` holds 3,330 pieces of real files installed on a Debian
machine (code, prose, structured data; ``bench/data/REALFILES.md``), chosen by a builder who
had never seen the detector. None is degenerate model output, so a verdict on one is a false
alarm. Each piece is judged as the relay judges a streamed answer to an English request (the
fake engine's word-sized deltas, the end-of-answer judgement at the finish), twice: as it is
(``raw``), and inside a Markdown code fence (``fenced``, as a model shows a file)::

    python bench/measure/detector/measure_realfiles.py         # false alarms per group
    python bench/measure/detector/measure_realfiles.py --list  # every verdict: id, signal, source
    python bench/measure/detector/measure_realfiles.py --kind licence --list

The verdicts read and judged are kept in ``bench/data/realfiles_verdicts.jsonl``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, os.environ.get("MEASURE_PROXY_ROOT", str(ROOT)))

DATA = ROOT / "bench" / "data" / "realfiles.jsonl.gz"
#: The request a file's text answers: English, asking for no language.
PROMPT = "Show me the file."
FENCES = {"python": "python", "c": "c", "javascript": "javascript", "shell": "bash"}


#: The detector's settings (``--block-loop`` turns on the block-loop signal, off by default).
CONFIG: Any = None


def judge(text: str) -> dict[str, Any] | None:
    from proxy.core.rewrite import RewritePolicy, rewrite_request
    from proxy.detect import Detector
    from tests.fakes.vllm import tokenize

    body = {"model": "m", "messages": [{"role": "user", "content": PROMPT}]}
    rw = rewrite_request(body, "chat", RewritePolicy())
    detector = Detector(
        CONFIG,
        expected_language=rw.expected_language,
        language_source=rw.expectation.source,
        accepted_languages=rw.expectation.accepted,
    )
    for piece in tokenize(text):
        verdict = detector.feed(piece, tokens=1)
        if verdict is not None:
            return {"signal": verdict.signal, "at": verdict.fired_at_char, "end": False}
    verdict = detector.finish(end_drift=True).verdict
    if verdict is None:
        return None
    return {"signal": verdict.signal, "at": verdict.onset_char, "end": True}


def fenced(row: dict[str, Any]) -> str:
    lang = next((v for k, v in FENCES.items() if row["kind"].startswith(k)), "")
    return f"Here is the file:\n\n```{lang}\n{row['text'].rstrip()}\n```\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", help="only pieces of this kind")
    parser.add_argument("--group", choices=("code", "prose", "structured"))
    parser.add_argument("--list", action="store_true", help="print every verdict")
    parser.add_argument("--json", type=Path, help="write every verdict to this file")
    parser.add_argument(
        "--block-loop", action="store_true", help="the block-loop signal on (off by default)"
    )
    args = parser.parse_args(argv)
    if args.block_loop:
        from proxy.detect import DetectorConfig

        global CONFIG
        CONFIG = DetectorConfig(block_loop=True)
    with gzip.open(DATA, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    rows = [
        r
        for r in rows
        if (args.kind is None or r["kind"] == args.kind)
        and (args.group is None or r["group"] == args.group)
    ]
    pieces: Counter[str] = Counter()
    alarms: Counter[tuple[str, str]] = Counter()
    signals: Counter[tuple[str, str]] = Counter()
    found: list[dict[str, Any]] = []
    for row in rows:
        pieces[row["group"]] += 1
        for how, text in (("raw", row["text"]), ("fenced", fenced(row))):
            verdict = judge(text)
            if verdict is None:
                continue
            alarms[(row["group"], how)] += 1
            signals[(how, verdict["signal"])] += 1
            found.append({"id": row["id"], "how": how, **verdict, "source": row["source"]})
            if args.list:
                print(f"{how:6} {row['id']:28} {verdict['signal']:16} {row['source']}")
    print(f"{len(rows)} pieces")
    for group in sorted(pieces):
        raw, fence = alarms[(group, "raw")], alarms[(group, "fenced")]
        share = 100 * raw / pieces[group]
        print(f"  {group:10} {pieces[group]:5}  raw {raw:3} ({share:.2f} %)  fenced {fence:3}")
    print("  by signal: " + ", ".join(f"{h} {s}={n}" for (h, s), n in sorted(signals.items())))
    if args.json:
        args.json.write_text(json.dumps(found, indent=0), encoding="utf-8")


if __name__ == "__main__":
    main()
