"""``coherence-guard explain``: why the detector judged one text as it did.

An operator who sees streams cut (``guard_verdicts_total{signal="block-loop"}``) and gets the
text from a user (the proxy never logs it) wants to know what the guard saw: which signal, how
much evidence against which threshold, where the degeneration began and how long the verdict
took after it. This command streams the text through a fresh detector as ``score`` does
(word-sized deltas, the ``GUARD_*`` thresholds of the environment) and prints that account,
with the variables that govern the signal, so a threshold can be tuned against the evidence.

Exit status, for scripts: 0 no verdict, 1 a verdict, 2 unreadable input or a bad setting (one
line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from typing import Any

#: What a verdict's ``score`` measures, per signal (``near-repetition`` comes from two signals:
#: its evidence names which).
SCORE_MEASURE = {
    "repetition": "copies",
    "token-flood": "copies",
    "block-loop": "copies",
    "near-repetition": "copies, or share of repeated word 4-grams",
    "compression": "zlib ratio of the recent text",
    "low-diversity": "1 - share of distinct words among the recent words",
    "script-intrusion": "share of the recent letters in the foreign script",
    "language-drift": "identifier's confidence in the other language",
    "salad": "share of prose words unknown to the expected language, or 1 - share of function "
    "words in a run of words without punctuation",
    "gibberish": "share of the text in unreadable runs, script switches inside words, or "
    "replacement characters (bytes that are not text)",
    "entropy-collapse": "-ln of the mean token entropy (nats)",
    "turn-leak": "1: a chat template's turn marker starts a line outside code",
}

#: The ``DetectorConfig`` field prefixes that govern each signal (``GUARD_`` + upper case).
GOVERNED_BY = {
    "repetition": ("repetition", "counter", "line_loop", "block_loop", "structured_relax"),
    "token-flood": ("repetition", "structured_relax"),
    "block-loop": ("block_loop", "counter_min_repeats", "structured_relax"),
    "near-repetition": ("line_loop", "ngram"),
    "compression": ("compression",),
    "low-diversity": ("diversity",),
    "script-intrusion": ("script",),
    "language-drift": ("language", "end_drift"),
    "salad": ("salad",),
    "gibberish": ("gibberish",),
    "entropy-collapse": ("entropy",),
    "turn-leak": ("turn_leak",),
}

_EXCERPT = 80


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="a UTF-8 text file with one answer ('-': stdin)")
    parser.add_argument(
        "--id",
        help="the input is a JSON Lines file as `score` reads it (.gz too): explain this line, "
        "with its expected language and engine tokens as `score` uses them",
    )
    parser.add_argument(
        "--language",
        help="the language the request asked for (ISO 639-1, e.g. it), as the proxy would pass",
    )
    parser.add_argument("--json", action="store_true", help="print the account as JSON")


def explain_text(
    text: str,
    config: Any = None,
    language: str | None = None,
    tokens: list[tuple[str, list[dict[str, Any]] | None]] | None = None,
) -> dict[str, Any]:
    """The detector's account of ``text``: its verdict, evidence and governing settings."""
    from proxy.cli.score import streamed
    from proxy.detect import DetectorConfig

    cfg = config or DetectorConfig()
    detector = streamed(text, config=cfg, expected_language=language, tokens=tokens)
    summary = detector.finish()
    verdict = summary.verdict
    account: dict[str, Any] = {"chars": len(text), "verdict": None}
    if verdict is None:
        account["worst"] = {
            "repetition_score": summary.repetition_score,
            "lexical_diversity": summary.lexical_diversity,
        }
        return account
    prefixes = GOVERNED_BY.get(verdict.signal, ())
    account["verdict"] = {
        "signal": verdict.signal,
        "score": verdict.score,
        "score_measures": SCORE_MEASURE.get(verdict.signal, "score"),
        "onset_char": verdict.onset_char,
        "fired_at_char": verdict.fired_at_char,
        "chars_after_onset": max(0, verdict.fired_at_char - verdict.onset_char),
        "evidence": dict(detector.evidence),
        "settings": {
            "GUARD_" + f.name.upper(): getattr(cfg, f.name)
            for f in fields(cfg)
            if f.name.startswith(prefixes)
        },
        "expected_language": verdict.expected_language,
        "language_source": verdict.language_source,
        "from_onset": text[verdict.onset_char : verdict.onset_char + _EXCERPT],
        "before_verdict": text[max(verdict.onset_char, verdict.fired_at_char - _EXCERPT) :][
            :_EXCERPT
        ],
    }
    return account


def _number(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:.3f}"


def _setting(value: object) -> str:
    """As the environment spells it (``true``, not Python's ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def render(account: dict[str, Any]) -> str:
    """The account as a few lines for a person."""
    verdict = account["verdict"]
    if verdict is None:
        worst = {k: v for k, v in account["worst"].items() if v is not None}
        extra = ", ".join(f"{k} {_number(v)}" for k, v in worst.items())
        return f"no verdict over {account['chars']:,} characters" + (
            f" (worst window: {extra})\n" if extra else "\n"
        )
    lines = [
        f"verdict: {verdict['signal']} at character {verdict['fired_at_char']:,} of "
        f"{account['chars']:,}",
        f"  began at character {verdict['onset_char']:,}: the verdict came "
        f"{verdict['chars_after_onset']:,} characters after it",
        f"  score {_number(verdict['score'])} ({verdict['score_measures']})",
    ]
    lines += [f"  {name} {_number(value)}" for name, value in verdict["evidence"].items()]
    if verdict["expected_language"]:
        lines.append(
            f"  judged against {verdict['expected_language']} "
            f"(from the {verdict['language_source'] or 'caller'})"
        )
    lines.append(f"  from the onset: {json.dumps(verdict['from_onset'], ensure_ascii=False)}")
    lines.append(
        f"  before the verdict: {json.dumps(verdict['before_verdict'], ensure_ascii=False)}"
    )
    lines.append("settings that govern it (coherence-guard config --explain says what each does):")
    lines += [f"  {name}={_setting(value)}" for name, value in verdict["settings"].items()]
    return "\n".join(lines) + "\n"


def _line(path: str, key: str) -> dict[str, Any] | None:
    """The JSON Lines row whose ``id`` is ``key`` (compared as text: ids may be numbers)."""
    from proxy.cli.score import open_text, read_jsonl

    source = sys.stdin if path == "-" else open_text(path)
    try:
        for row in read_jsonl(source):
            if str(row.get("id")) == key:
                if not isinstance(row.get("text"), str):
                    raise ValueError(f"line without a string 'text' field (id={key!r})")
                return row
    finally:
        if source is not sys.stdin:
            source.close()
    return None


def run(args: argparse.Namespace) -> int:
    from proxy.cli.score import detector_config, expected_language_of, token_stream

    config = detector_config("explain")
    if config is None:
        return 2
    tokens = None
    language = args.language
    try:
        if args.id is not None:
            row = _line(args.input, args.id)
            if row is None:
                print(f"coherence-guard explain: no line with id {args.id!r} in {args.input}",
                      file=sys.stderr)  # fmt: skip
                return 2
            text = row["text"]
            language = language or expected_language_of(row)
            tokens = token_stream(row)
        elif args.input == "-":
            text = sys.stdin.read()
        else:
            with open(args.input, encoding="utf-8") as fh:
                text = fh.read()
    except OSError as exc:
        print(f"coherence-guard explain: cannot read {args.input}: {exc.strerror}", file=sys.stderr)
        return 2
    except UnicodeDecodeError as exc:  # before ValueError, which it is
        print(
            f"coherence-guard explain: {args.input} is not UTF-8 text: {exc.reason}",
            file=sys.stderr,
        )
        return 2
    except ValueError as exc:  # a line that is not JSON, or has no text
        print(f"coherence-guard explain: {args.input}: {exc}", file=sys.stderr)
        return 2
    account = explain_text(text, config, language, tokens)
    if args.json:
        sys.stdout.write(json.dumps(account, ensure_ascii=False, indent=2) + "\n")
    else:
        sys.stdout.write(render(account))
    return 0 if account["verdict"] is None else 1
