"""When to stop sending vLLM's usage stream options to an engine, and when to try again.

The proxy asks the engine for ``stream_options: {include_usage, continuous_usage_stats}`` (exact
token counts per chunk). vLLM and SGLang accept both; llama.cpp's server accepts
``include_usage`` and ignores fields it does not know. Engines that validate strictly reject the
request instead, naming the field:

* OpenAI-style envelope (OpenAI, vLLM, llama.cpp, most gateways):
  ``{"error": {"message": "Unrecognized request argument supplied: stream_options", "param":
  …}}`` — vLLM's older shape puts the same keys at the top level (``"object": "error"``);
* pydantic ``extra="forbid"`` behind FastAPI: a 422 whose ``detail[].loc`` is
  ``["body", "stream_options", "continuous_usage_stats"]`` with ``"Extra inputs are not
  permitted"``, or a 400 whose message quotes that text and the field.

Only such a rejection turns the options off — not any 400/422 that happens to contain the word
(an engine error can quote the prompt) — and only for :attr:`UsageOptions.retry_after` seconds:
an engine upgraded or swapped behind the proxy gets the options again at the next probe. Pure:
the clock is injected, the caller does the I/O and the metric.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import orjson

#: The fields the proxy adds; a rejection must name one of them.
FIELDS = ("stream_options", "continuous_usage_stats", "include_usage")
#: Words of a rejection of an unknown or invalid argument (OpenAI, pydantic, llama.cpp).
_REJECTION = re.compile(
    r"unrecognized|unknown|unsupported|unexpected|not permitted|not allowed|extra|invalid|"
    r"not supported|does not support",
    re.IGNORECASE,
)
_FIELD = re.compile(r"\b(" + "|".join(FIELDS) + r")\b")


def names_usage_option(status: int, body: bytes) -> bool:
    """Whether an engine's error answer rejects one of the usage options the proxy added."""
    if status not in (400, 422):
        return False
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(doc, dict):
        return False
    error = doc.get("error")
    if isinstance(error, dict):
        return _error_names(error)
    if doc.get("object") == "error" or "message" in doc:
        return _error_names(doc)
    detail = doc.get("detail")
    if isinstance(detail, list):
        return any(_loc_names(item) for item in detail if isinstance(item, dict))
    return False


def _error_names(error: dict[str, Any]) -> bool:
    param = error.get("param")
    if isinstance(param, str) and param.split(".")[0] == "stream_options":
        return True
    message = error.get("message")
    return (
        isinstance(message, str)
        and _FIELD.search(message) is not None
        and _REJECTION.search(message) is not None
    )


def _loc_names(item: dict[str, Any]) -> bool:
    loc = item.get("loc")
    return isinstance(loc, list) and any(part in FIELDS for part in loc)


class UsageOptions:
    """Whether to add the usage options now: yes, unless the engine rejected them less than
    ``retry_after`` seconds ago (then the next request after that is the probe).

    ``on_change(active)`` is called when the fallback starts or ends (the metric).
    """

    __slots__ = ("_clock", "_on_change", "_until", "retry_after")

    def __init__(
        self,
        retry_after: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.retry_after = retry_after
        self._clock = clock
        self._on_change = on_change
        self._until: float | None = None

    @property
    def fallback(self) -> bool:
        """True while requests go out without the options."""
        if self._until is None:
            return False
        if self._clock() >= self._until:
            self._until = None  # time to probe again
            if self._on_change is not None:
                self._on_change(False)
            return False
        return True

    def wanted(self) -> bool:
        return not self.fallback

    def rejected(self) -> None:
        """The engine rejected the options: leave them out for ``retry_after`` seconds."""
        started = self._until is None
        self._until = self._clock() + self.retry_after
        if started and self._on_change is not None:
            self._on_change(True)
