"""Language identification shared by request rewriting and the detector.

NOTE: the library behind it is chosen by measurement in the detector work (issue 3); this
signature is the contract the rewriter relies on.
"""

from __future__ import annotations

import functools
from typing import Any


def identify_language(text: str) -> tuple[str, float] | None:
    """Return (ISO 639-1 code, confidence in [0, 1]) or None when the text is too short or the
    identification is unsure. Pure and synchronous; callers keep it off the per-token path."""
    if len(text.strip()) < 20:
        return None
    code, prob = _identifier().classify(text)
    return (str(code), float(prob))


@functools.cache
def _identifier() -> Any:
    from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_modelpath(MODEL_DIR / MODEL_FILE, norm_probs=True)
