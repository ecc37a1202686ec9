"""``coherence-guard score``: run the detector offline over a JSON Lines file of texts.

The scorer streams every text through the very same :class:`~proxy.detect.Detector` the proxy
uses, in token-sized deltas (whitespace-split words with their leading whitespace), so what it
measures is what the proxy would do. Input lines carry ``id`` and ``text`` (optional ``lang``,
``prompt_language``, ``label``, ``onset_char``, ``kind``, ``degen_type``); output lines carry the
verdict. A line that also carries the engine's ``tokens`` (with ``token_logprobs`` and
``top_logprobs``, as real-engine captures do) is fed token by token with each token's logprobs in
the shape the proxy passes on from the stream (``logprobs.content`` entries), so the
entropy signal sees what it would see in production. With ``--summary`` and labels present it
prints precision, recall, false-positive rates per group, the detection delay (characters from
the labelled onset to the firing point) and, per signal, precision and recall at three threshold
settings (``sensitive``, ``default``, ``strict``): the trade-off an operator picks from.

Also runnable as ``python -m proxy.cli.score``.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.detect import Detector, DetectorConfig

# A word with its leading whitespace: roughly what one BPE token looks like in a stream.
_DELTA_RE = re.compile(r"\s*\S+|\s+")


def split_deltas(text: str) -> Iterator[str]:
    """Cut ``text`` into token-sized deltas whose concatenation is ``text`` exactly.

    Long whitespace-free runs (CJK, floods of punctuation) are cut every 4 characters, so a
    Chinese sentence does not arrive as one giant "token".
    """
    for match in _DELTA_RE.finditer(text):
        piece = match.group()
        if len(piece) <= 12:
            yield piece
        else:
            for i in range(0, len(piece), 4):
                yield piece[i : i + 4]


@dataclass(frozen=True, slots=True)
class Scored:
    """One scored text: the input row and the detector's decision."""

    row: dict[str, Any]
    degenerate: bool
    signal: str | None
    score: float | None
    fired_at_char: int | None
    onset_char: int | None

    def output(self) -> dict[str, Any]:
        return {
            "id": self.row.get("id"),
            "degenerate": self.degenerate,
            "signal": self.signal,
            "score": None if self.score is None else round(self.score, 4),
            "fired_at_char": self.fired_at_char,
            "onset_char": self.onset_char,
        }


def token_stream(row: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]] | None]] | None:
    """The row's engine tokens as (delta, ``logprobs.content`` entries) pairs, or None when the
    row has no tokens or they do not spell its text (then the text is fed as words).

    ``top_logprobs`` may be a ``{token: logprob}`` mapping per token (the completions format
    and the capture format of ``bench/data/build_realgen.py``) or the chat format's list of
    ``{"token", "logprob"}`` objects.
    """
    tokens = row.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        return None
    if "".join(tokens) != row.get("text"):
        return None
    chosen = row.get("token_logprobs")
    top = row.get("top_logprobs")
    out: list[tuple[str, list[dict[str, Any]] | None]] = []
    for i, token in enumerate(tokens):
        logprob = chosen[i] if isinstance(chosen, list) and i < len(chosen) else None
        if not isinstance(logprob, int | float):
            out.append((token, None))
            continue
        alts = top[i] if isinstance(top, list) and i < len(top) else None
        if isinstance(alts, dict):
            alts = [{"token": k, "logprob": v} for k, v in alts.items()]
        entry = {"token": token, "logprob": float(logprob), "top_logprobs": alts or []}
        out.append((token, [entry]))
    return out


def streamed(
    text: str,
    *,
    config: Any = None,
    expected_language: str | None = None,
    tokens: list[tuple[str, list[dict[str, Any]] | None]] | None = None,
) -> Detector:
    """A fresh detector fed ``text`` up to its first verdict (as the engine's ``tokens`` when
    given, else as word-sized deltas), not yet finished: ``score`` and ``explain`` feed the
    same way, so their accounts of one text agree."""
    from proxy.detect import Detector

    detector = Detector(config, expected_language=expected_language)
    if tokens is not None:
        for delta, logprobs in tokens:
            if detector.feed(delta, tokens=1, logprobs=logprobs) is not None:
                break
    else:
        for delta in split_deltas(text):
            if detector.feed(delta) is not None:
                break
    return detector


def score_text(
    text: str,
    *,
    config: Any = None,
    expected_language: str | None = None,
    tokens: list[tuple[str, list[dict[str, Any]] | None]] | None = None,
) -> Scored:
    """Stream one text through a fresh detector; return its decision."""
    detector = streamed(text, config=config, expected_language=expected_language, tokens=tokens)
    verdict = detector.finish().verdict
    if verdict is None:
        return Scored({}, False, None, None, None, None)
    return Scored(
        {}, True, verdict.signal, verdict.score, verdict.fired_at_char, verdict.onset_char
    )


def expected_language_of(
    row: dict[str, Any], *, keys: tuple[str, ...] = ("prompt_language", "lang")
) -> str | None:
    """The language the text was asked to be in: ``prompt_language``, else ``lang`` when it is
    an ISO 639-1 code (not ``code`` or ``mixed``). This plays the part of the request's language
    constraint that the proxy passes to the detector (``keys=("prompt_language",)``: only what a
    request would carry; a document's ``lang`` is nothing a proxy knows)."""
    for key in keys:
        value = row.get(key)
        if isinstance(value, str) and len(value) == 2 and value.isalpha():
            return value.lower()
    return None


def score_rows(
    rows: Iterable[dict[str, Any]],
    *,
    config: Any = None,
    use_language: bool = True,
    prompt_language_only: bool = False,
) -> Iterator[Scored]:
    keys = ("prompt_language",) if prompt_language_only else ("prompt_language", "lang")
    for row in rows:
        if not isinstance(row.get("text"), str):
            raise ValueError(f"line without a string 'text' field (id={row.get('id')!r})")
        expected = expected_language_of(row, keys=keys) if use_language else None
        result = score_text(
            row["text"], config=config, expected_language=expected, tokens=token_stream(row)
        )
        yield Scored(
            row,
            result.degenerate,
            result.signal,
            result.score,
            result.fired_at_char,
            result.onset_char,
        )


def open_text(path: str) -> IO[str]:
    """A JSONL file, gzip-compressed when its name ends in ``.gz``."""
    if path.endswith(".gz"):
        import gzip

        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


class NotJSONLines(ValueError):
    """The input's first line is not JSON: not a JSON Lines file at all (a plain text answer,
    say), rather than one with a broken line."""


def read_jsonl(stream: IO[str]) -> Iterator[dict[str, Any]]:
    first = True
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            error = NotJSONLines if first else ValueError
            raise error(f"line {number}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"line {number}: not a JSON object")
        first = False
        yield row


def _percentile(values: list[int], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return float(ordered[index])


class _Tally:
    """Confusion counts for one group of labelled texts."""

    __slots__ = ("fn", "fp", "tn", "tp")

    def __init__(self) -> None:
        self.tp = self.fp = self.tn = self.fn = 0

    def add(self, label_degenerate: bool, predicted: bool) -> None:
        if label_degenerate:
            if predicted:
                self.tp += 1
            else:
                self.fn += 1
        elif predicted:
            self.fp += 1
        else:
            self.tn += 1

    def row(self) -> str:
        n = self.tp + self.fp + self.tn + self.fn
        pos = self.tp + self.fn
        neg = self.fp + self.tn
        recall = f"{self.tp / pos:.3f}" if pos else "-"
        fpr = f"{self.fp / neg:.4f}" if neg else "-"
        precision = f"{self.tp / (self.tp + self.fp):.3f}" if self.tp + self.fp else "-"
        return f"{n:>5} {pos:>4} {neg:>5} {precision:>9} {recall:>7} {self.fp:>4} {fpr:>7}"


_HEADER = (
    f"{'group':<34}{'n':>5} {'deg':>4} {'ok':>5} {'precision':>9} {'recall':>7}"
    f" {'FP':>4} {'FPR':>7}"
)
_TRAP_KINDS = frozenset(
    {"code", "json", "table", "lyrics", "poetry", "changelog", "legal", "markdown", "quotes"}
)


NOTHING_TO_SUMMARISE = "no labelled lines: nothing to summarise\n"


def _labelled(result: Scored) -> bool:
    return result.row.get("label") in ("healthy", "degenerate")


def summarise(results: list[Scored]) -> str:
    """Render the precision/recall/FPR table and the detection delay."""
    groups: dict[str, _Tally] = defaultdict(_Tally)
    delays: list[int] = []
    labelled = 0
    for result in results:
        if not _labelled(result):
            continue
        labelled += 1
        truth = result.row.get("label") == "degenerate"
        keys = ["overall", f"kind={result.row.get('kind')}", f"lang={result.row.get('lang')}"]
        if truth:
            keys.append(f"degen_type={result.row.get('degen_type')}")
        else:
            trap = result.row.get("kind") in _TRAP_KINDS
            keys.append("healthy=traps" if trap else "healthy=answers+technical")
        for key in keys:
            groups[key].add(truth, result.degenerate)
        onset = result.row.get("onset_char")
        if truth and result.degenerate and isinstance(onset, int):
            assert result.fired_at_char is not None
            delays.append(max(0, result.fired_at_char - onset))
    if not labelled:
        return NOTHING_TO_SUMMARISE
    lines = [_HEADER]
    order = sorted(groups, key=lambda k: (k != "overall", k.split("=")[0], k))
    lines += [f"{key:<34}{groups[key].row()}" for key in order]
    p50, p90 = _percentile(delays, 0.5), _percentile(delays, 0.9)
    if p50 is not None:
        lines.append(
            f"detection delay after onset (chars): p50 {p50:.0f}, p90 {p90:.0f}, n={len(delays)}"
        )
    return "\n".join(lines) + "\n"


#: Threshold settings the summary compares: each scales every "how much evidence" threshold
#: (copies, spans, shares, ratios) by the factor, in the direction that asks for more evidence
#: when the factor is above 1.
PRESETS: tuple[tuple[str, float], ...] = (("sensitive", 0.8), ("default", 1.0), ("strict", 1.25))
# Fields where a larger value asks for more evidence, and where a smaller one does.
_MORE = (
    "repetition_min_repeats", "repetition_min_span_chars", "counter_min_repeats",
    "counter_min_span_chars", "line_loop_min_repeats", "line_loop_min_span_chars",
    "ngram_max_repeat_rate", "ngram_min_compression", "script_max_share", "script_min_letters",
    "language_min_confidence", "language_min_share", "language_min_identified_chars",
    "entropy_min_compression", "compression_max_ratio",
)  # fmt: skip
_LESS = ("diversity_min_ratio", "entropy_max_nats")
_CAPPED = frozenset({"ngram_max_repeat_rate", "script_max_share", "language_min_confidence"})


def scaled_config(config: Any, factor: float) -> Any:
    """``config`` with every evidence threshold scaled by ``factor`` (shares stay under 1)."""
    import dataclasses

    from proxy.detect import DetectorConfig

    base = config or DetectorConfig()
    changes: dict[str, Any] = {}
    for name in _MORE + _LESS:
        value = getattr(base, name)
        new = value * factor if name in _MORE else value / factor
        if name in _CAPPED:
            new = min(new, 0.99)
        changes[name] = round(new) if isinstance(value, int) else new
    return dataclasses.replace(base, **changes)


def signal_table(runs: list[tuple[str, list[Scored]]]) -> str:
    """Per threshold setting and per signal: verdicts on degenerate and healthy texts, the
    signal's precision, and the recall of all degenerate texts it alone caught."""
    lines = [f"{'setting':<10}{'signal':<18}{'fired':>6}{'TP':>5}{'FP':>4}{'precision':>10}"
             f"{'recall':>8}"]  # fmt: skip
    for name, results in runs:
        labelled = [r for r in results if r.row.get("label") in ("healthy", "degenerate")]
        positives = sum(r.row.get("label") == "degenerate" for r in labelled)
        per: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for r in labelled:
            if r.signal is not None:
                per[r.signal][0 if r.row.get("label") == "degenerate" else 1] += 1
        total_tp = sum(tp for tp, _ in per.values())
        total_fp = sum(fp for _, fp in per.values())
        for signal, (tp, fp) in [*sorted(per.items()), ("all", [total_tp, total_fp])]:
            precision = f"{tp / (tp + fp):.3f}" if tp + fp else "-"
            recall = f"{tp / positives:.3f}" if positives else "-"
            lines.append(f"{name:<10}{signal:<18}{tp + fp:>6}{tp:>5}{fp:>4}{precision:>10}"
                         f"{recall:>8}")  # fmt: skip
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "input", help="JSON Lines file (.gz too) with 'id' and 'text' per line ('-': stdin)"
    )
    parser.add_argument("-o", "--output", help="write one verdict line per text here")
    parser.add_argument(
        "--summary",
        action="store_true",
        help="print precision/recall/FPR per kind, lang and degen_type, and detection delay",
    )
    parser.add_argument(
        "--no-expected-language",
        action="store_true",
        help="do not pass the line's prompt_language/lang to the detector as the expected language",
    )
    parser.add_argument(
        "--prompt-language-only",
        action="store_true",
        help="expect only a line's prompt_language (what a request carries), never its lang",
    )
    parser.add_argument(
        "--no-sweep",
        action="store_true",
        help="with --summary: the per-signal table at the default thresholds only (one pass)",
    )


def detector_config(command: str) -> DetectorConfig | None:
    """The environment's detector thresholds, or ``None`` after one line on stderr: a bad
    ``GUARD_*`` value is the user's to fix, so it gets a sentence, not a traceback."""
    from proxy.settings import ConfigError, load_detector_config

    try:
        return load_detector_config()
    except ConfigError as exc:
        print(f"coherence-guard {command}: {exc}", file=sys.stderr)
        return None


def run(args: argparse.Namespace) -> int:
    config = detector_config("score")
    if config is None:
        return 2
    try:
        source: IO[str] = sys.stdin if args.input == "-" else open_text(args.input)
    except OSError as exc:
        print(f"coherence-guard score: cannot read {args.input}: {exc.strerror}", file=sys.stderr)
        return 2
    results: list[Scored] = []
    out: IO[str] | None = None
    try:
        if args.output:
            out = open(args.output, "w", encoding="utf-8")  # noqa: SIM115
        elif not args.summary:
            out = sys.stdout
        for result in score_rows(
            read_jsonl(source),
            config=config,
            use_language=not args.no_expected_language,
            prompt_language_only=args.prompt_language_only,
        ):
            if out is not None:
                out.write(json.dumps(result.output(), ensure_ascii=False) + "\n")
            if args.summary:
                results.append(result)
    except NotJSONLines as exc:
        print(
            f"coherence-guard score: {args.input}: {exc}: score reads JSON Lines (one "
            f'{{"text": ...}} object per line); to judge one answer in a text file: '
            f"coherence-guard explain {shlex.quote(args.input)}",
            file=sys.stderr,
        )
        return 2
    except ValueError as exc:
        print(f"coherence-guard score: {args.input}: {exc}", file=sys.stderr)
        return 2
    finally:
        if source is not sys.stdin:
            source.close()
        if out is not None and out is not sys.stdout:
            out.close()
    if args.summary:
        sys.stdout.write(summarise(results))
        if not any(map(_labelled, results)):
            return 0  # the message says so; a table of zeros would say nothing more
        runs = [("default", results)]
        if not args.no_sweep:
            rows = [r.row for r in results]
            use = not args.no_expected_language
            runs = [
                (name, results if factor == 1.0 else list(
                    score_rows(rows, config=scaled_config(config, factor), use_language=use,
                               prompt_language_only=args.prompt_language_only)
                ))
                for name, factor in PRESETS
            ]  # fmt: skip
        sys.stdout.write("\nper signal (first verdict per text) at each threshold setting\n")
        sys.stdout.write(signal_table(runs))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proxy.cli.score", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
