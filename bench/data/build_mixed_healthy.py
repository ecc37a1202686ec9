"""Build ``bench/data/mixed_healthy.jsonl``: real healthy text that mixes scripts with formulas,
code and units, German technical prose full of compounds, and lists of names — the kinds of text
the ``gibberish`` and ``salad`` signals must never fire on (sources and licences in
``bench/data/MIXED_HEALTHY.md``).

Nothing here is written for the set: every text is a region of a Debian package's documentation
(manual pages rendered as the development corpus renders them, the Debian Reference and FAQ),
a translation catalogue of an installed Debian package (its messages joined, one a line), a
development-corpus text (``../shared/corpus/dev.jsonl``), or the test data
``tests/data/mixed/`` keeps with its source. Regions are chosen by what they contain (symbols
against CJK letters, long lower-case compounds, comma lists), never by what a signal says::

    mkdir -p /tmp/debs && cd /tmp/debs && apt-get download manpages-zh manpages-ja \\
        manpages-ja-dev debian-reference-zh-cn debian-reference-ja debian-faq-ko \\
        debian-reference-de debian-reference-pt-br && for f in *.deb; do dpkg-deb -x $f x; done
    python bench/data/build_mixed_healthy.py --debs /tmp/debs/x \\
        --dev ../shared/corpus/dev.jsonl > bench/data/mixed_healthy.jsonl
"""

from __future__ import annotations

import argparse
import gettext
import gzip
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Row = dict[str, Any]

#: CJK, Hangul and Thai letters.
_WIDE = "\u0e01-\u0e4e\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
#: A wide letter directly against a Latin letter, a digit or a non-ASCII symbol (formula, unit,
#: code, option name), either way round.
_MIXED = re.compile(
    f"[{_WIDE}](?=[A-Za-z0-9\u00b2\u00b3\u00b5\u0370-\u03ff\u2070-\u22ff\u2460-\u24ff])"
    f"|[A-Za-z0-9\u00b2\u00b3\u00b5\u0370-\u03ff\u2070-\u22ff\u2460-\u24ff](?=[{_WIDE}])"
)
#: A lower-case word of 16 letters or more (German compounds and derived adjectives).
_LONG = re.compile(r"(?<![\w-])[a-zäöüß]{16,}(?![\w-])")
#: Three or more single words between commas (an enumeration of names or terms).
_ENUM = re.compile(r"(?:\b[^\W\d_]{3,},\s+){3,}")
_REGION = 2500


def render(page: Path) -> str:
    """A manual page rendered as the development corpus renders them."""
    out = subprocess.run(
        ["man", "--nj", "--nh", "-E", "UTF-8", "-l", str(page)],
        capture_output=True,
        env={"MANWIDTH": "80", "LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"},
        check=False,
    ).stdout
    text = subprocess.run(["col", "-bx"], input=out, capture_output=True, check=False).stdout
    lines = text.decode("utf-8", "replace").splitlines()
    return "\n".join(lines[1:-1]).strip()  # header and footer lines


def regions(text: str, size: int = _REGION) -> Iterator[str]:
    """Consecutive regions of about ``size`` characters, cut at blank lines."""
    chunk: list[str] = []
    length = 0
    for para in re.split(r"\n\s*\n", text):
        chunk.append(para)
        length += len(para) + 2
        if length >= size:
            yield "\n\n".join(chunk).strip()
            chunk, length = [], 0
    if length >= size // 3:
        yield "\n\n".join(chunk).strip()


def untranslated(text: str, lang: str) -> bool:
    """Whether a paragraph of 80 characters or more is in English in a text of another
    language: a document translated in part (the development corpus drops such pages; its
    drift against the document's language is a known gap, not this set's subject)."""
    from proxy.detect.language import classify, strip_noise

    for para in re.split(r"\n\s*\n", text):
        clean = strip_noise(para)
        if len(clean) >= 80 and lang != "en":
            found = classify(clean)
            if found is not None and found[0] == "en" and found[1] >= 0.5:
                return True
    return False


def best(candidates: list[tuple[float, Row]], n: int) -> list[Row]:
    ranked = sorted(candidates, key=lambda c: -c[0])
    return [
        row for score, row in ranked if score > 0 and not untranslated(row["text"], row["lang"])
    ][:n]


def man_pages(root: Path, lang_dir: str, lang: str, skip: set[str], n: int) -> list[Row]:
    scored = []
    pages = []
    for page in sorted((root / "usr/share/man" / lang_dir).glob("man*/*.gz")):
        name = page.name.removesuffix(".gz")
        if f"man-{lang_dir}-{name}" in skip:
            continue  # in the development corpus already
        with gzip.open(page, "rt", encoding="utf-8", errors="replace") as fh:
            source = fh.read()
        pages.append((len(_MIXED.findall(source)) / max(1, len(source)), name, page))
    # Rendering is slow: only the pages whose source mixes the most are rendered.
    for _, name, page in sorted(pages, key=lambda p: -p[0])[: 4 * n]:
        text = render(page)[:20000]
        for i, region in enumerate(regions(text)):
            score = len(_MIXED.findall(region)) / max(1, len(region))
            row = {
                "id": f"man-{lang_dir}-{name}-r{i}",
                "kind": "cjk-technical",
                "lang": lang,
                "source": f"Debian manpages ({lang_dir}) {page.relative_to(root)}, rendered with "
                "man(1) and col -bx; licence per page (see the package copyright)",
                "text": region,
            }
            scored.append((score, row))
    # One region per page at most: the set covers many pages rather than one long one.
    seen: set[str] = set()
    out = []
    for row in best(scored, 10 * n):
        name = row["id"].rsplit("-r", 1)[0]
        if name not in seen:
            seen.add(name)
            out.append(row)
    return out[:n]


def doc_regions(path: Path, lang: str, kind: str, pattern: re.Pattern[str], n: int) -> list[Row]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        text = fh.read()
    scored = []
    for i, region in enumerate(regions(text)):
        row = {
            "id": f"{path.name.split('.txt')[0]}-r{i}",
            "kind": kind,
            "lang": lang,
            "source": f"Debian {path.parts[-3] if 'FAQ' in path.parts else 'debian-reference'} "
            f"{path.name}, region {i} (GPL-2+; see the package copyright)",
            "text": region,
        }
        scored.append((len(pattern.findall(region)) / max(1, len(region)), row))
    return best(scored, n)


def catalogues(
    lang: str, lang_code: str, n: int, kind: str = "messages", pattern: re.Pattern[str] = _MIXED
) -> list[Row]:
    """Translated messages of installed Debian packages (apt, dpkg, grep, glib, ...), joined."""
    out = []
    for mo in sorted(Path("/usr/share/locale", lang, "LC_MESSAGES").glob("*.mo")):
        try:
            with mo.open("rb") as fh:
                catalog = gettext.GNUTranslations(fh)._catalog  # type: ignore[attr-defined]
        except (OSError, UnicodeDecodeError):
            continue  # a catalogue in a legacy encoding
        messages = [v for k, v in catalog.items() if isinstance(v, str) and k and len(v) >= 20]
        text = "\n".join(messages)
        if len(text) < 1000:
            continue
        for i, region in enumerate(regions(text.replace("\n", "\n\n"), _REGION)):
            out.append(
                (
                    len(pattern.findall(region)) / len(region),
                    {
                        "id": f"mo-{lang}-{mo.stem}-r{i}",
                        "kind": kind,
                        "lang": lang_code,
                        "source": f"{mo} (installed Debian package's translation catalogue; "
                        "the package's licence, GPL or LGPL)",
                        "text": region.replace("\n\n", "\n"),
                    },
                )
            )
    return best(out, n)


def dev_texts(path: Path) -> list[Row]:
    """Development-corpus texts of the kinds: Chinese answers to mathematics and logic
    questions, Japanese answers with formulas, German technical text with long compounds."""
    out = []
    for line in path.open(encoding="utf-8"):
        row = json.loads(line)
        if row["label"] != "healthy":
            continue
        text = row["text"]
        pick = (
            row.get("category") in ("数学计算", "逻辑推理")
            or (row["lang"] in ("ja", "ko", "zh") and len(_MIXED.findall(text)) >= 40)
            or (row["lang"] == "de" and len(_LONG.findall(text)) >= 8)
        )
        if pick:
            kind = "german-compounds" if row["lang"] == "de" else "cjk-answer"
            if row["kind"] == "technical":
                kind = "german-compounds" if row["lang"] == "de" else "cjk-technical"
            out.append(
                {
                    "id": "dev-" + row["id"],
                    "kind": kind,
                    "lang": row["lang"],
                    "source": f"development corpus {row['id']}: {row['source']}",
                    "text": text,
                }
            )
    return out


def test_data(root: Path) -> list[Row]:
    """The real snippets the tests keep (tests/data/mixed/*.jsonl), with their sources."""
    out = []
    for path in sorted((root / "tests" / "data" / "mixed").glob("*.jsonl")):
        for line in path.open(encoding="utf-8"):
            row = json.loads(line)
            if row["use"] == "healthy":  # not the drift splices' parts or quoted fragments
                out.append({k: row[k] for k in ("id", "kind", "lang", "source", "text")})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--debs", type=Path, required=True, help="extracted Debian packages")
    parser.add_argument("--dev", type=Path, default=None, help="the development corpus")
    args = parser.parse_args()
    root = args.debs
    skip: set[str] = set()
    rows: list[Row] = []
    if args.dev is not None and args.dev.is_file():
        skip = {json.loads(line)["id"] for line in args.dev.open(encoding="utf-8")}
        rows += dev_texts(args.dev)
    rows += man_pages(root, "zh_CN", "zh", skip, 12)
    rows += man_pages(root, "ja", "ja", skip, 12)
    ref = root / "usr/share/debian-reference"
    rows += doc_regions(ref / "debian-reference.zh-cn.txt.gz", "zh", "cjk-technical", _MIXED, 8)
    rows += doc_regions(ref / "debian-reference.ja.txt.gz", "ja", "cjk-technical", _MIXED, 8)
    rows += doc_regions(ref / "debian-reference.de.txt.gz", "de", "german-compounds", _LONG, 10)
    rows += doc_regions(ref / "debian-reference.pt-br.txt.gz", "pt", "name-lists", _ENUM, 10)
    faq = root / "usr/share/doc/debian/FAQ/debian-faq.ko.txt.gz"
    rows += doc_regions(faq, "ko", "cjk-technical", _MIXED, 8)
    for lang, code in (("th", "th"), ("ko", "ko"), ("zh_CN", "zh"), ("ja", "ja")):
        rows += catalogues(lang, code, 4)
    rows += catalogues("de", "de", 8, "german-compounds", _LONG)
    rows += catalogues("pt_BR", "pt", 4, "name-lists", _ENUM)
    rows += test_data(Path(__file__).resolve().parents[2])
    seen: set[str] = set()
    for row in rows:
        if row["id"] in seen:
            continue
        seen.add(row["id"])
        sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
