"""An engine that reports its count of the prompt only when an answer ends, and counts prompts
on ``POST /tokenize`` in vLLM's or llama.cpp's dialect: an ASGI app for real uvicorn
(:class:`tests.servers.engines.UvicornEngine`).

Why its own engine: the proxy must ask for the count exactly where the engine gave none before
an abort, and what it reports must be the engine's own count. Here the count is the engine's
alone: its own chat template (:func:`render`), its own tokenizer (:func:`count`), its own
conversion of Responses and Messages requests to turns, none of them the proxy's code; the
answer it would have given uncut reports the same number (``usage`` at the end), which is what
a test compares with.

Streams come from :mod:`tests.fakes.vllm`'s writers (vLLM's wire format) with the usage moved to
the end, as llama.cpp sends it: chat and completions drop ``continuous_usage_stats`` (unless
``continuous``), Messages' ``message_start`` carries no ``input_tokens``, Responses have usage
only on the terminal event (as vLLM writes them). A request whose ``x-test-answer`` header is
``loop`` gets a looping answer (the guard cuts it), any other a short healthy one.

``/tokenize`` dialects (see :mod:`proxy.core.prompt_count`): ``vllm`` counts ``messages`` or
``prompt`` (``{"count", "max_model_len", "tokens"}``); ``llamacpp`` tokenizes ``content`` only
(``{"tokens"}``, ``[]`` for a body without it) and renders a chat template on
``/apply-template``; ``none`` serves no such route (404); ``hang`` never answers, and records
when the asker gave up (its connection closed).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from tests.fakes.vllm import FakeVLLM, Script, messages_events, responses_events
from tests.servers.engines import Receive, Scope, Send, read_body

Dialect = Literal["vllm", "llamacpp", "none", "hang"]

LOOP = "Fine start. " + "The answer is the answer. " * 200
HEALTHY = "A short and healthy answer."
_TOKEN = re.compile(r"<[^>]*>|\w+|[^\w\s]")


def count(text: str) -> int:
    """The engine's tokenizer: one token per markup tag, word and punctuation mark."""
    return len(_TOKEN.findall(text))


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict))


def render(messages: list[dict[str, Any]]) -> str:
    """The engine's chat template, with its generation prompt."""
    turns = "".join(f"<{m['role']}>{_text(m.get('content'))}</s>" for m in messages)
    return turns + "<assistant>"


def turns(path: str, req: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat turns the engine builds from a Responses or Messages request."""
    out: list[dict[str, Any]] = []
    system = req.get("instructions") if path == "/v1/responses" else req.get("system")
    if system:
        out.append({"role": "system", "content": _text(system)})
    if path == "/v1/responses":
        given = req["input"]
        return out + ([{"role": "user", "content": given}] if isinstance(given, str) else given)
    return out + list(req["messages"])


def prompt_tokens(path: str, req: dict[str, Any]) -> int:
    """The engine's count of a generating request's prompt."""
    if path == "/v1/completions":
        return count(req["prompt"])
    if path == "/v1/chat/completions":
        return count(render(req["messages"]))
    return count(render(turns(path, req)))


@dataclass
class Asked:
    """One request the engine received."""

    path: str
    body: Any
    user_agent: str
    #: Set when the asker closed the connection before an answer (``hang`` only).
    gave_up: threading.Event = field(default_factory=threading.Event)


class CountingEngine:
    """The ASGI app; ``asked`` lists every request, in order."""

    def __init__(self, dialect: Dialect = "vllm", *, continuous: bool = False) -> None:
        self.dialect = dialect
        self.continuous = continuous
        self.asked: list[Asked] = []

    def counts(self) -> list[Asked]:
        """The requests to the counting routes."""
        return [a for a in self.asked if a.path in ("/tokenize", "/apply-template")]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        req = orjson.loads(body) if body else None
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        asked = Asked(scope["path"], req, headers.get("user-agent", ""))
        self.asked.append(asked)
        path = scope["path"]
        if path in ("/tokenize", "/apply-template"):
            await self._count(path, req, asked, receive, send)
        elif path == "/v1/models":
            await _json(send, 200, {"object": "list", "data": [{"id": "m", "object": "model"}]})
        elif isinstance(req, dict) and req.get("stream"):
            loop = headers.get("x-test-answer") == "loop"
            await self._stream(path, req, LOOP if loop else HEALTHY, receive, send)
        else:
            await _json(send, 404, {"detail": "Not Found"})

    async def _count(self, path: str, req: Any, asked: Asked, receive: Receive, send: Send) -> None:
        if self.dialect == "none" or (path == "/apply-template" and self.dialect != "llamacpp"):
            await _json(send, 404, {"detail": "Not Found"})
            return
        if self.dialect == "hang":
            while (await receive())["type"] != "http.disconnect":
                pass
            asked.gave_up.set()
            return
        if path == "/apply-template":
            await _json(send, 200, {"prompt": render(req["messages"])})
        elif self.dialect == "llamacpp":
            content = req.get("content")
            tokens = list(range(count(content))) if isinstance(content, str) else []
            await _json(send, 200, {"tokens": tokens})
        else:
            n = count(render(req["messages"])) if "messages" in req else count(req["prompt"])
            await _json(send, 200, {"count": n, "max_model_len": 4096, "tokens": list(range(n))})

    async def _stream(
        self, path: str, req: dict[str, Any], text: str, receive: Receive, send: Send
    ) -> None:
        script = Script(texts=[text], prompt_tokens=prompt_tokens(path, req), model="m")
        if path == "/v1/responses":
            events = responses_events(req, script)
        elif path == "/v1/messages":
            events = [_late_message_start(e) for e in messages_events(req, script)]
        else:
            opts = dict(req.get("stream_options") or {})
            if not self.continuous:
                opts.pop("continuous_usage_stats", None)
            late = {**req, "stream_options": opts}
            events = FakeVLLM()._events(late, path == "/v1/chat/completions", script)
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        try:
            for event in events:
                if gone.is_set() or event is None:
                    break
                await send({"type": "http.response.body", "body": event, "more_body": True})
                await asyncio.sleep(0)
            await send({"type": "http.response.body", "body": b""})
        finally:
            watcher.cancel()


def _late_message_start(event: bytes | None) -> bytes | None:
    """``message_start`` without the input count (the engine sends it at the end only)."""
    if event is None or not event.startswith(b"event: message_start\n"):
        return event
    head, _, data = event.partition(b"data: ")
    obj: MutableMapping[str, Any] = orjson.loads(data)
    del obj["message"]["usage"]["input_tokens"]
    return head + b"data: " + orjson.dumps(obj) + b"\n\n"


async def _json(send: Send, status: int, obj: Any) -> None:
    body = orjson.dumps(obj)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
