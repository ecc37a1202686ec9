"""False positives on real healthy source files, streamed through the detector.

Healthy code repeats by design (tables, enum and switch arms, test cases, migrations, unrolled
data), so every repetition signal has to leave real source alone. This script samples real
files the machine already has — Python from site-packages and the standard library, C headers
from ``/usr/include``, C sources, shell, JavaScript from ``node_modules``, SQL (PostgreSQL's
extension upgrade scripts: migrations), YAML, Perl, Go, Rust, CSS, CMake — and streams each
one through :class:`proxy.detect.Detector` twice: bare (a code completion) and inside a
Markdown fence after a sentence (a chat answer). Every verdict is a false positive::

    python bench/measure/detector/healthy_code.py                    # the default sample
    python bench/measure/detector/healthy_code.py --per-language 40  # a smaller sample
    python bench/measure/detector/healthy_code.py --list paths.txt   # write the sampled paths

(The default sample is reported per language and signal.)

The sample is deterministic for a given machine image (paths sorted, then a seeded shuffle),
files of at least 2,000 characters, each cut at its first 16,000 (about what 4,096 tokens of
code make). Not a test: the files are not in the repository.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from proxy.cli.score import split_deltas  # noqa: E402
from proxy.detect import Detector  # noqa: E402

#: language -> (roots searched, file name suffixes, files sampled by default)
SOURCES: dict[str, tuple[tuple[str, ...], tuple[str, ...], int]] = {
    "python": ((sys.prefix + "/lib",), (".py",), 150),
    "c-header": (("/usr/include",), (".h",), 120),
    "c": (("/usr", "/root/.pyenv"), (".c",), 50),
    "shell": (("/usr", "/etc"), (".sh", ".bash"), 40),
    "javascript": (("/usr/lib/node_modules", "/usr/share/nodejs"), (".js",), 80),
    "sql": (("/usr/share/postgresql",), (".sql",), 54),
    "yaml": (("/usr", "/etc", sys.prefix + "/lib"), (".yaml", ".yml"), 60),
    "perl": (("/usr/share/perl", "/usr/lib/x86_64-linux-gnu/perl"), (".pm", ".pl"), 40),
    "go": (("/usr/share", "/root/go"), (".go",), 20),
    "rust": (("/usr/share", "/root/.cargo"), (".rs",), 10),
    "css": (("/usr/share", "/usr/lib/node_modules"), (".css",), 20),
    "cmake": (("/usr/share/cmake-3.25",), (".cmake",), 30),
}
FENCE = {"python": "python", "c-header": "c", "c": "c", "shell": "bash", "javascript": "js"}
MIN_CHARS = 2000
MAX_CHARS = 16000


def _candidates(roots: tuple[str, ...], suffixes: tuple[str, ...]) -> list[Path]:
    found: set[Path] = set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in ("proc", "sys", "__pycache__")]
            for name in filenames:
                if name.endswith(suffixes):
                    path = Path(dirpath, name)
                    try:
                        if path.is_file() and path.stat().st_size >= MIN_CHARS:
                            found.add(path.resolve())
                    except OSError:
                        continue
    return sorted(found)


def sample(per_language: int | None, seed: int = 30) -> list[tuple[str, Path, str]]:
    """(language, path, text) of the sampled files, deterministic for a machine image."""
    out: list[tuple[str, Path, str]] = []
    seen_texts: set[int] = set()
    for language, (roots, suffixes, default) in SOURCES.items():
        paths = _candidates(roots, suffixes)
        random.Random(f"{seed}-{language}").shuffle(paths)
        want = default if per_language is None else min(default, per_language)
        taken = 0
        for path in paths:
            if taken >= want:
                break
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if len(text) < MIN_CHARS or hash(text) in seen_texts:
                continue  # a copy of a file already taken (vendored twice) counts once
            seen_texts.add(hash(text))
            out.append((language, path, text[:MAX_CHARS]))
            taken += 1
    return out


def judge(text: str) -> tuple[str, int] | None:
    """(signal, fired at char) of the first verdict on ``text`` streamed as the score CLI
    streams it, the end-of-stream judgement included; None when it passes."""
    detector = Detector()
    for delta in split_deltas(text):
        if detector.feed(delta) is not None:
            break
    verdict = detector.finish().verdict
    return None if verdict is None else (verdict.signal, verdict.fired_at_char)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-language", type=int, default=None)
    parser.add_argument("--list", type=Path, help="write the sampled paths here")
    args = parser.parse_args(argv)
    files = sample(args.per_language)
    if args.list:
        args.list.write_text("".join(f"{lang}\t{path}\n" for lang, path, _ in files))
    Detector().feed("x" * 200)  # load fastText outside the timing
    per_language: Counter[str] = Counter()
    fired: Counter[str] = Counter()
    signals: Counter[str] = Counter()
    started = time.process_time()
    chars = 0
    for language, path, text in files:
        per_language[language] += 1
        fence = FENCE.get(language, "")
        for mode, body in (("bare", text), ("fenced", f"Here it is:\n\n```{fence}\n{text}\n```\n")):
            chars += len(body)
            found = judge(body)
            if found is not None:
                fired[language] += 1
                signals[found[0]] += 1
                print(f"FP {mode:<6} {language:<10} {found[0]:<16} at {found[1]:>6}  {path}")
    seconds = time.process_time() - started
    print(f"\n{'language':<12} {'files':>6} {'verdicts (bare + fenced)':>26}")
    for language in SOURCES:
        print(f"{language:<12} {per_language[language]:>6} {fired[language]:>26}")
    total = sum(per_language.values())
    print(f"{'all':<12} {total:>6} {sum(fired.values()):>26}")
    print(f"by signal: {dict(signals)}")
    print(f"{chars / 1e6:.1f} M chars in {seconds:.1f} s of process time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
