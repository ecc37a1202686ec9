"""What the engine's context allows: each model's ``max_model_len``, and its context-length 400s.

The proxy gives a request that sets no token limit a default (``GUARD_MAX_TOKENS_DEFAULT``,
8,192) so one loop cannot run to the end of a 128K context. But a default the engine cannot
accept turns a request it would serve into an error: vLLM 0.32 rejects any ``max_tokens`` above
the model's context (``max_tokens=8192 cannot be greater than max_model_len=4096``), while the
same request without the field is served with "the rest of the context" as its limit. So:

* the proxy learns each model's ``max_model_len`` (vLLM lists it in ``GET /v1/models``): from
  the engine monitor's periodic check, or once, lazily, on the first request for a model it does
  not know (:class:`EngineContexts`; afterwards a dict lookup per request);
* where the context is no larger than the default, the engine's own limit (the rest of the
  context) is already within it, so no limit is sent at all
  (:func:`proxy.core.rewrite.rewrite_request` with ``engine_limit``) — exact whatever the prompt's
  length, with no tokenizing round trip, and accepted by every vLLM version;
* where the limit is not known (first request, an engine that lists no context) or the engine
  still refuses the proxy's default, its 400 is recognised (:func:`context_error`, vLLM's three
  wordings) and the request is sent once more without the default.

A client's own limit is never changed here: if it is too large for the engine, the engine's
error is the answer the client would have had without the proxy.

Pure parsing plus one small I/O class; llama.cpp and other engines that list no
``max_model_len`` (and accept any limit, stopping at the context's end) keep the default.

The same list names the engine: each entry's ``owned_by`` is the server's own name (vLLM writes
``vllm``, llama.cpp's server ``llamacpp``, SGLang ``sglang``). :func:`model_owner` reads it and
:class:`EngineContexts` keeps it beside the contexts, so a span can say which engine answered
(``gen_ai.provider.name``, :mod:`proxy.observability.tracing`) without a request of its own.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

log = logging.getLogger(__name__)

#: Seconds before a model still unknown after a look-up is looked up again (engines that list no
#: context — llama.cpp — must not cost a ``/v1/models`` per request).
RETRY_AFTER = 60.0
#: The look-up runs on the first request's path: it must not hold it long.
LOOKUP_TIMEOUT = 2.0


#: The proxy's own look-ups name themselves, so an engine's access log (and a test engine) can
#: tell them from the clients' requests.
LOOKUP_USER_AGENT = "coherence-guard (model context look-up)"


def model_entries(body: bytes) -> list[dict[str, Any]] | None:
    """The entries (objects) of an OpenAI ``/v1/models`` answer, or None if it is not one."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None
    return [e for e in entries if isinstance(e, dict)]


def model_contexts(body: bytes) -> dict[str, int]:
    """``{id: max_model_len}`` of the entries of a ``/v1/models`` answer that list one."""
    out: dict[str, int] = {}
    for entry in model_entries(body) or ():
        name, length = entry.get("id"), entry.get("max_model_len")
        if isinstance(name, str) and type(length) is int and length > 0:
            out[name] = length
    return out


def model_owner(body: bytes) -> str | None:
    """The ``owned_by`` every entry of a ``/v1/models`` answer shares (the engine's name for
    itself), or None when the entries disagree (a gateway in front of several engines), name
    none, or the body is not a model list."""
    owners = {e.get("owned_by") for e in model_entries(body) or ()}
    if len(owners) != 1:
        return None
    owner = owners.pop()
    return owner if isinstance(owner, str) and owner else None


@dataclass(frozen=True, slots=True)
class ContextError:
    """An engine's refusal of a token limit that does not fit its context."""

    #: The model's context (``max_model_len``).
    max_model_len: int
    #: The prompt's tokens, where the message says (older vLLM); None otherwise.
    prompt_tokens: int | None = None

    @property
    def allowed(self) -> int:
        """The largest limit the engine accepts for this request."""
        return self.max_model_len - (self.prompt_tokens or 0)


# vLLM >= 0.1x (vllm/renderers/params.py, TokenizeParams): the limit alone is checked against the
# context; a limit within it is then lowered to the rest of the context by the engine itself.
_OVER_CONTEXT = re.compile(
    r"\b(?:max_tokens|max_completion_tokens|max_output_tokens)=\d+ cannot be greater than "
    r"max_model_len=(\d+)"
)
# vLLM ~0.9-0.10 (serving_engine._validate_input): "'max_tokens' or 'max_completion_tokens' is
# too large: 8000. This model's maximum context length is 4096 tokens and your request has 2778
# input tokens (8000 > 4096 - 2778)."
_TOO_LARGE = re.compile(
    r"maximum context length is (\d+) tokens and your request has (\d+) input tokens"
)
# Older vLLM (and OpenAI's own wording): "This model's maximum context length is 4096 tokens.
# However, you requested 10778 tokens (2778 in the messages, 8000 in the completion)."
_REQUESTED = re.compile(
    r"maximum context length is (\d+) tokens\. However, you requested \d+ tokens "
    r"\((\d+) in the \w+, \d+ in the completion\)"
)


def context_error(status: int, body: bytes) -> ContextError | None:
    """The context-length refusal in an engine's error answer, or None when it is anything else
    (a prompt too long even without output is not one: no limit would fit)."""
    if status != 400 or len(body) > 16384:
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    error = doc.get("error")
    message = (error if isinstance(error, dict) else doc).get("message")
    if not isinstance(message, str):
        return None
    found = _OVER_CONTEXT.search(message)
    if found is not None:
        return ContextError(int(found[1]))
    found = _TOO_LARGE.search(message) or _REQUESTED.search(message)
    if found is not None:
        length, prompt = int(found[1]), int(found[2])
        if prompt < length:
            return ContextError(length, prompt)
    return None


class EngineContexts:
    """Each model's context as the engine lists it; one per worker (on :class:`Proxy`).

    :meth:`get` is the per-request lookup. :meth:`learn` asks the engine once for a model not
    known yet (concurrent first requests share the one look-up), and not again for
    :data:`RETRY_AFTER` seconds if the model is still not listed with a context.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._known: dict[str, int] = {}
        #: The only model's context, for requests that name no model (vLLM serves its one).
        self._only: int | None = None
        self._clock = clock
        #: The engine's name for itself (``owned_by`` in its model list; :func:`model_owner`),
        #: once a model list has been read.
        self.owner: str | None = None
        self._looked_up = -RETRY_AFTER
        self._pending: asyncio.Future[None] | None = None

    def get(self, model: str | None) -> int | None:
        if model is None:
            return self._only
        return self._known.get(model)

    def update(self, contexts: Mapping[str, int], *, complete: bool = True) -> None:
        """Record what the engine listed (``complete``: the whole list, so forget the rest)."""
        if complete:
            self._known = dict(contexts)
        else:
            self._known.update(contexts)
        self._only = next(iter(self._known.values())) if len(self._known) == 1 else None

    def learned(self, model: str | None, error: ContextError) -> None:
        """The engine named the model's context in a refusal."""
        if model is not None:
            self.update({model: error.max_model_len}, complete=False)

    def should_learn(self, model: str | None) -> bool:
        return self.get(model) is None and self._clock() - self._looked_up >= RETRY_AFTER

    async def learn(
        self, client: httpx.AsyncClient, upstream_url: str, headers: Mapping[str, str]
    ) -> None:
        """``GET /v1/models`` (once for all concurrent callers); never raises for HTTP."""
        if self._pending is not None:
            await asyncio.shield(self._pending)
            return
        self._pending = asyncio.get_running_loop().create_future()
        try:
            url = upstream_url.rstrip("/") + "/v1/models"
            asked = {**headers, "user-agent": LOOKUP_USER_AGENT}
            resp = await client.get(url, headers=asked, timeout=LOOKUP_TIMEOUT)
            if resp.status_code == 200:
                self.update(model_contexts(resp.content))
                self.owner = model_owner(resp.content) or self.owner
        except httpx.HTTPError as exc:
            log.debug("could not read the engine's model list: %s", exc)
        finally:
            self._looked_up = self._clock()
            self._pending.set_result(None)
            self._pending = None
