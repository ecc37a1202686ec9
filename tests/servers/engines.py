"""A vLLM-shaped engine as an ASGI app (run under real uvicorn) and as an aiohttp.web app: two
independent HTTP server implementations answering with vLLM's wire format.

Both echo the request's own text back (the last message's ``content`` for chat, ``prompt`` for
completions), one word per SSE event, so a test can tell whose answer a client received. Both
*read the request body through the server's own API*, which is what makes uvicorn answer
``Expect: 100-continue`` with an interim ``100 Continue`` first (vLLM's server does the same).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
import uvicorn
from aiohttp import web

from tests.net import HANG_GUARD

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


#: Delay between reading a request and answering it.
PREFILL_SECONDS = 0.003


def _text(req: dict[str, Any]) -> str:
    if "messages" in req:
        return str(req["messages"][-1]["content"])
    return str(req.get("prompt", ""))


def sse_events(path: str, req: dict[str, Any]) -> list[bytes]:
    """The SSE events vLLM would write for this request (echoing its text)."""
    chat = path.endswith("chat/completions")
    base: dict[str, Any] = {
        "id": "chatcmpl-1" if chat else "cmpl-1",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": 1,
        "model": req.get("model", "m"),
    }
    words = _text(req).split(" ")
    events = []
    for i, word in enumerate(words):
        piece = word if i == 0 else " " + word
        last = i == len(words) - 1
        if chat:
            delta: dict[str, Any] = {"content": piece}
            if i == 0:
                delta["role"] = "assistant"
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None}
        else:
            choice = {"index": 0, "text": piece, "logprobs": None}
        choice["finish_reason"] = "stop" if last else None
        events.append(b"data: " + orjson.dumps({**base, "choices": [choice]}) + b"\n\n")
    if (req.get("stream_options") or {}).get("include_usage"):
        usage = {
            "prompt_tokens": 3,
            "completion_tokens": len(words),
            "total_tokens": 3 + len(words),
        }
        events.append(b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def json_answer(path: str, req: dict[str, Any]) -> bytes:
    """The non-streamed answer (``stream`` false: ``GUARD_MODE=off`` passes that on)."""
    chat = path.endswith("chat/completions")
    text = _text(req)
    choice: dict[str, Any] = (
        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        if chat
        else {"index": 0, "text": text, "finish_reason": "stop"}
    )
    return orjson.dumps(
        {
            "id": "x",
            "object": "chat.completion" if chat else "text_completion",
            "created": 1,
            "model": req.get("model", "m"),
            "choices": [choice],
        }
    )


async def read_body(receive: Receive) -> bytes:
    """The whole request body, read through the server's own API."""
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            return body


async def asgi_engine(scope: Scope, receive: Receive, send: Send) -> None:
    """The engine as a raw ASGI app (what uvicorn serves vLLM's FastAPI app through)."""
    if scope["type"] != "http":
        return
    body = await read_body(receive)
    req = orjson.loads(body) if body else {}
    path = scope["path"]
    # Prefill: the answer starts a moment after the body was read, so an interim ``100
    # Continue`` (written when the body is read) travels in its own packet, as with vLLM.
    await asyncio.sleep(PREFILL_SECONDS)
    if req.get("stream"):
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for event in sse_events(path, req):
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    answer = json_answer(path, req)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": answer})


class UvicornEngine:
    """:func:`asgi_engine` under real uvicorn (httptools, keep-alive) in a thread."""

    def __init__(self, app: Any = asgi_engine, **tls: Any) -> None:
        """``tls``: uvicorn's ``ssl_certfile``, ``ssl_keyfile``, ``ssl_ca_certs``,
        ``ssl_cert_reqs`` (an https engine)."""
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.scheme = "https" if tls else "http"
        config = uvicorn.Config(
            app, http="httptools", lifespan="off", log_level="warning", access_log=False, **tls
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, args=([self.sock],), daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def __enter__(self) -> UvicornEngine:
        self.thread.start()
        deadline = time.monotonic() + HANG_GUARD
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn engine did not start")
            time.sleep(0.005)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(HANG_GUARD)
        self.sock.close()


async def _aiohttp_handler(request: web.Request) -> web.StreamResponse:
    req = orjson.loads(await request.read())
    await asyncio.sleep(PREFILL_SECONDS)
    if not req.get("stream"):
        return web.Response(body=json_answer(request.path, req), content_type="application/json")
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for event in sse_events(request.path, req):
        await resp.write(event)
    await resp.write_eof()
    return resp


class AiohttpEngine:
    """The same engine on aiohttp.web (its own HTTP writer, chunked framing) in a thread."""

    def __init__(self) -> None:
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _main(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", _aiohttp_handler)
        app.router.add_post("/v1/completions", _aiohttp_handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server)
        self.port = server.sockets[0].getsockname()[1]
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> AiohttpEngine:
        self.thread.start()
        if not self._ready.wait(HANG_GUARD):
            raise RuntimeError("aiohttp engine did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(HANG_GUARD)
