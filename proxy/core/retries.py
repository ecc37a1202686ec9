"""Which requests are retries of one the guard just aborted as a loop.

Structured-output libraries (instructor, pydantic-ai) and agent loops answer a cut reply by
sending the same request again. With greedy or low-temperature sampling the engine walks into
the same loop and the guard cuts it again: the client pays for the loop once per retry. The
proxy remembers, for a short while, a digest of each request it aborted; a request whose body
digest is remembered is answered in heal mode instead (the loop is cut and the engine continues
with its repetition defences raised), see ``GUARD_RETRY_AFTER_ABORT``.

Pure: the clock is passed in, nothing is read or written outside this object. The memory is
bounded in entries (least recently used go first) and in time (entries expire after ``ttl``
seconds); it keeps 16-byte digests, never the prompt text. One memory per worker process: with
several workers a retry heals only when it lands on the worker that aborted the first try.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Collection
from typing import Any

import orjson

#: Bytes of the BLAKE2b digest kept per request: collisions are not a concern at this size.
DIGEST_BYTES = 16


def request_key(endpoint: str, body: Any) -> bytes:
    """The digest of a request on ``endpoint``: its JSON body with keys sorted, so a client
    that serializes the same request with another key order or spacing is the same request."""
    try:
        canonical = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # an integer beyond 64 bits: fall back to the standard library
        import json

        canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    h = hashlib.blake2b(endpoint.encode(), digest_size=DIGEST_BYTES)
    h.update(b"\0")
    h.update(canonical)
    return h.digest()


def retry_keys(endpoint: str, body: Any) -> tuple[bytes, bytes | None]:
    """The request's own digest, and the digest of the request it re-asks, if it is one.

    Structured-output libraries do not resend a cut answer's request unchanged: instructor
    appends the cut reply as an assistant message and a user (or tool) message naming the
    validation error, then asks again. A chat or Messages request whose last two messages are
    such a pair is therefore also looked up without them."""
    key = request_key(endpoint, body)
    if not isinstance(body, dict):
        return key, None
    messages = body.get("messages")
    if not isinstance(messages, list) or len(messages) < 3:
        return key, None
    reply, correction = messages[-2], messages[-1]
    if not (isinstance(reply, dict) and isinstance(correction, dict)):
        return key, None
    if reply.get("role") != "assistant" or correction.get("role") not in ("user", "tool"):
        return key, None
    return key, request_key(endpoint, {**body, "messages": messages[:-2]})


class AbortMemory:
    """Digests of aborted requests, each kept ``ttl`` seconds, at most ``size`` of them."""

    __slots__ = ("_entries", "size", "ttl")

    def __init__(self, size: int, ttl: float) -> None:
        self.size = size
        self.ttl = ttl
        #: digest -> when it expires (monotonic seconds), oldest first.
        self._entries: OrderedDict[bytes, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def remember(self, key: bytes, now: float) -> None:
        """``key`` was just aborted: remember it for ``ttl`` seconds from ``now``."""
        if self.size <= 0 or self.ttl <= 0:
            return
        self._entries[key] = now + self.ttl
        self._entries.move_to_end(key)
        self._expire(now)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def aborted_recently(self, key: bytes, now: float) -> bool:
        """Whether ``key`` was aborted less than ``ttl`` seconds before ``now``."""
        self._expire(now)
        return key in self._entries

    def forget(self, key: bytes) -> None:
        """The retry ended well: a third identical request is a new question, not a retry."""
        self._entries.pop(key, None)

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries:
            key, expires = next(iter(entries.items()))
            if expires > now:
                break
            del entries[key]


def defended(
    body: dict[str, Any],
    *,
    repetition_penalty: float,
    frequency_penalty: float,
    temperature: float,
    fields: Collection[str] | None = None,
) -> dict[str, Any]:
    """``body`` with the engine's repetition defences raised, for a retry that cannot be
    healed (a structured answer: a continuation would restart its schema mid-string): the
    penalties of heal's first continuation, and a temperature step for a greedy request, which
    would otherwise walk into the same loop again. Fields the client set higher are kept.

    ``fields``: the sampling fields the route passes to the engine (``None``: chat and
    completions, which pass them all). Every route's fields carry the same names (Responses
    takes chat's penalties; vLLM's Messages route passes only ``temperature``, ``top_p`` and
    ``top_k``, and drops the rest), so a defence the route would drop is not written at all.
    """
    out = dict(body)
    rp = body.get("repetition_penalty")
    base = float(rp) if isinstance(rp, (int, float)) and not isinstance(rp, bool) else 1.0
    if repetition_penalty and (fields is None or "repetition_penalty" in fields):
        out["repetition_penalty"] = round(max(base, 1.0 + repetition_penalty), 4)
    fp = body.get("frequency_penalty")
    base = float(fp) if isinstance(fp, (int, float)) and not isinstance(fp, bool) else 0.0
    if frequency_penalty and (fields is None or "frequency_penalty" in fields):
        out["frequency_penalty"] = round(max(base, frequency_penalty), 4)
    t = body.get("temperature")
    greedy = t == 0 and not isinstance(t, bool)
    if temperature and greedy and (fields is None or "temperature" in fields):
        out["temperature"] = temperature
    return out


def raised(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The fields :func:`defended` changed, for the log line."""
    return sorted(k for k in after if k not in before or before[k] != after[k])
