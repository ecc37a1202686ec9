"""Asking the engine how many tokens a prompt is, for an aborted answer whose engine sent no count.

What to ask and how to read the answers is :mod:`proxy.core.prompt_count`'s; this is the I/O:
at most three small POSTs (``/tokenize``; on llama.cpp's chat, ``/apply-template`` and
``/tokenize`` again) on the proxy's httpx client, all within one budget of seconds. Nothing here
raises: a count that does not come, for whatever reason (no such route, an error, a slow
engine), is ``None``, and the answer's usage leaves the field out. Only an aborted answer that
lacks the count asks (:class:`proxy.core.guard.StreamGuard` holds its ending meanwhile), so a
healthy stream never waits for this, and an abort waits at most that budget longer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import httpx
import orjson

from proxy.core.prompt_count import (
    CountAsk,
    read_count,
    rendered_prompt,
    renders_apart,
    text_body,
)

log = logging.getLogger(__name__)

#: The proxy's own asks name themselves, so an engine's access log (and a test engine) can tell
#: them from the clients' requests.
PROMPT_COUNT_USER_AGENT = "coherence-guard (prompt count)"


async def count_prompt(
    client: httpx.AsyncClient,
    engine_url: str,
    headers: Mapping[str, str],
    ask: CountAsk,
    budget: float,
) -> int | None:
    """The engine's count of the prompt ``ask`` describes, or ``None``, within ``budget``
    seconds for all the asks together."""
    base = engine_url.rstrip("/")
    sent = {**headers, "user-agent": PROMPT_COUNT_USER_AGENT}
    try:
        async with asyncio.timeout(budget):
            answer = await _post(client, base + "/tokenize", sent, ask.body)
            count = read_count(answer)
            if count is not None or not ask.chat or not renders_apart(answer):
                return count
            # llama.cpp: its chat template through /apply-template, then those tokens.
            rendered = await _post(client, base + "/apply-template", sent, ask.body)
            prompt = rendered_prompt(rendered)
            if prompt is None:
                return None
            return read_count(await _post(client, base + "/tokenize", sent, text_body(prompt)))
    except (TimeoutError, httpx.HTTPError) as exc:
        log.debug("the engine did not count the prompt: %r", exc)
        return None


async def _post(client: httpx.AsyncClient, url: str, headers: Mapping[str, str], body: Any) -> Any:
    """The JSON of a 200 answer to ``body``, else ``None``."""
    resp = await client.post(
        url,
        content=orjson.dumps(body),
        headers={**headers, "content-type": "application/json"},
    )
    if resp.status_code != 200:
        return None
    try:
        return orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        return None
