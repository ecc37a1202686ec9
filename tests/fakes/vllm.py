"""A fake vLLM OpenAI-compatible server that speaks vLLM's wire format over a real socket.

Hand-written HTTP/1.1 on asyncio streams (keep-alive, chunked responses) so a test controls the
bytes exactly: how the SSE stream is cut into TCP writes, when a connection dies, how long each
token takes. It records every request (method, path, headers, JSON body) and, for streams, when
the client disconnected — the proof that the proxy closed the upstream (which is what makes
the real vLLM abort the generation).

Wire format (see FACTS.md; vLLM serialises pydantic models with unset fields excluded, compact
JSON, non-ASCII unescaped):

    data: {"id":"chatcmpl-…","object":"chat.completion.chunk","created":…,"model":…,
           "choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,
           "finish_reason":null}]}

Runs in its own thread with its own event loop, so sync and async tests can both use it, or as
a process: ``python -m tests.fakes.vllm --port 8000 --text-file healthy.txt``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.server.engine_context import LOOKUP_USER_AGENT
from tests.net import HANG_GUARD

_TOKEN = re.compile(r"\s*\S+|\s+")


def tokenize(text: str) -> list[str]:
    """Word-level pieces with their leading whitespace, the way BPE tokens usually look."""
    return _TOKEN.findall(text)


@dataclass
class Script:
    """What the fake does for one request.

    ``texts`` holds one text per choice index (the last is reused for higher indices);
    ``reasoning`` is streamed on the ``reasoning`` channel first. ``chunk_delay`` is the delay
    before each token chunk; ``write_sizes`` cuts the response body into TCP writes of those
    sizes (cycled) instead of one write per event. ``die_after`` drops the connection after that
    many token chunks. ``status``/``error_body`` answer with an error instead of a stream.
    ``raw_stream`` is sent verbatim as the SSE body. ``reject_stream_options`` answers 400 like
    an engine that does not know vLLM's usage options. ``hang`` never answers.
    """

    texts: list[str] = field(default_factory=lambda: ["Hello there, this is a healthy reply."])
    reasoning: str | None = None
    tool_call: tuple[str, str] | None = None
    finish_reason: str = "stop"
    chunk_delay: float = 0.0
    first_delay: float = 0.0
    write_sizes: list[int] | None = None
    die_after: int | None = None
    mid_stream_error: int | None = None
    status: int | None = None
    error_body: bytes | None = None
    raw_stream: bytes | None = None
    reject_stream_options: bool = False
    hang: bool = False
    model: str = "fake-model"
    prompt_tokens: int = 7
    #: The model's context: a limit that does not fit is refused with the 400 of
    #: ``context_wording`` (vLLM's: "0.32" checks the limit alone, the older ones prompt + limit).
    max_model_len: int | None = None
    context_wording: str = "0.32"
    #: Delay before the chunked terminator that follows ``[DONE]`` (uvicorn writes it apart).
    tail_delay: float = 0.0
    #: The response id (default: ``chatcmpl-``/``cmpl-`` + a fixed suffix).
    response_id: str | None = None
    #: Ids as vLLM makes them, one per request: chat ``chatcmpl-<X-Request-Id>``
    #: (``_base_request_id``), Responses the body's ``request_id`` (a vLLM extra field).
    ids_from_request: bool = False
    created: int = 1700000000


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    started: float
    json: Any = None
    finished: float | None = None
    disconnected: float | None = None
    chunks_sent: int = 0
    completed: bool = False
    peer: tuple[str, int] | None = None


class FakeVLLM:
    """The server; ``script`` is what the next requests get (``scripts`` queue wins)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.script = Script()
        self.scripts: list[Script] = []
        self.requests: list[Recorded] = []
        self.on_request: Callable[[Recorded], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        #: Whether /v1/models lists the script's ``max_model_len`` (vLLM does).
        self.list_max_model_len = True
        #: The ``owned_by`` of its /v1/models entries: the engine's name for itself (vLLM's
        #: ``vllm``; llama.cpp's server writes ``llamacpp``).
        self.owned_by = "vllm"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FakeVLLM:
        self._thread = threading.Thread(target=self._run, name="fake-vllm", daemon=True)
        self._thread.start()
        if not self._ready.wait(HANG_GUARD):
            raise RuntimeError("fake vLLM did not start")
        return self

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        await self._server.wait_closed()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(HANG_GUARD)

    def __enter__(self) -> FakeVLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def drop_idle_connections(self) -> None:
        """Close kept-alive connections, as a server's keep-alive timeout does."""
        assert self._loop is not None
        done = threading.Event()

        def drop() -> None:
            for w in list(self._writers):
                w.transport.abort()
            # abort() closes the socket in a callback it schedules: signal after it has run, so
            # the caller never races a connection that is still open.
            assert self._loop is not None
            self._loop.call_soon(done.set)

        self._loop.call_soon_threadsafe(drop)
        done.wait(HANG_GUARD)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = HANG_GUARD) -> bool:
        """Poll until ``predicate()`` holds; ``timeout`` is a hang guard, not a margin."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.005)
        return predicate()

    @property
    def last(self) -> Recorded:
        return self.requests[-1]

    @property
    def client_requests(self) -> list[Recorded]:
        """What clients sent through the proxy: every request but the proxy's own ``/v1/models``
        look-ups of the models' contexts."""
        return [r for r in self.requests if r.headers.get("user-agent") != LOOKUP_USER_AGENT]

    def guarded_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.split("?")[0] in SURFACE_PATHS]

    # ------------------------------------------------------------------ HTTP
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    if line:
                        k, _, v = line.partition(":")
                        headers[k.strip().lower()] = v.strip()
                length = int(headers.get("content-length", "0"))
                body = await reader.readexactly(length) if length else b""
                rec = Recorded(method, target, headers, body, time.monotonic())
                rec.peer = writer.get_extra_info("peername")
                with contextlib.suppress(ValueError):
                    rec.json = orjson.loads(body) if body else None
                self.requests.append(rec)
                if self.on_request is not None:
                    self.on_request(rec)
                keep = await self._respond(rec, reader, writer)
                rec.finished = time.monotonic()
                if not keep:
                    return
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

    def _next_script(self) -> Script:
        return self.scripts.pop(0) if self.scripts else self.script

    async def _respond(
        self, rec: Recorded, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        path = rec.path.split("?")[0]
        if path in SURFACE_PATHS and rec.method == "POST":
            return await self._completion(rec, reader, writer, self._next_script())
        if path == "/health":
            return self._send(writer, 200, b"", "text/plain")
        if path == "/v1/models":
            entry: dict[str, Any] = {
                "id": self.script.model,
                "object": "model",
                "owned_by": self.owned_by,
            }
            if self.script.max_model_len is not None and self.list_max_model_len:
                entry["max_model_len"] = self.script.max_model_len
            return self._send(writer, 200, orjson.dumps({"object": "list", "data": [entry]}))
        if path == "/version":
            return self._send(writer, 200, b'{"version":"0.11.0"}')
        if path in ("/tokenize", "/v1/embeddings", "/echo"):
            echo = {"path": rec.path, "method": rec.method, "body": rec.json}
            return self._send(writer, 200, orjson.dumps(echo), extra={"x-fake": "yes"})
        if path in ("/v1/stream", "/inference/v1/generate") and rec.method == "POST":
            return await self._plain_stream(rec, reader, writer, self._next_script())
        return self._send(writer, 404, b'{"detail":"Not Found"}')

    async def _plain_stream(
        self,
        rec: Recorded,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        script: Script,
    ) -> bool:
        """A streamed answer on a route the proxy does not guard (named SSE events), for the
        pass-through path."""
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for word in tokenize(script.texts[0]):
            if script.chunk_delay:
                await asyncio.sleep(script.chunk_delay)
            if writer.transport.is_closing():
                rec.disconnected = time.monotonic()
                return False
            event = orjson.dumps({"type": "response.output_text.delta", "delta": word})
            self._chunk(writer, b"event: response.output_text.delta\ndata: " + event + b"\n\n")
            rec.chunks_sent += 1
            try:
                await writer.drain()
            except ConnectionError:
                rec.disconnected = time.monotonic()
                return False
        writer.write(b"0\r\n\r\n")
        rec.completed = True
        return True

    def _send(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        ctype: str = "application/json",
        extra: dict[str, str] | None = None,
    ) -> bool:
        head = [
            f"HTTP/1.1 {status} X",
            "date: Mon, 01 Jan 2024 00:00:00 GMT",
            "server: uvicorn",
            f"content-length: {len(body)}",
            f"content-type: {ctype}",
        ]
        for k, v in (extra or {}).items():
            head.append(f"{k}: {v}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        return True

    async def _completion(
        self,
        rec: Recorded,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        script: Script,
    ) -> bool:
        req = rec.json if isinstance(rec.json, dict) else {}
        if script.hang:
            await reader.read()
            rec.disconnected = time.monotonic()
            return False
        if script.status is not None:
            err = script.error_body or orjson.dumps(
                {
                    "error": {
                        "message": "fake upstream error",
                        "type": "BadRequestError",
                        "param": None,
                        "code": script.status,
                    }
                }
            )
            return self._send(writer, script.status, err)
        if script.reject_stream_options and "stream_options" in req:
            err = orjson.dumps(
                {
                    "object": "error",
                    "message": "Unrecognized request argument supplied: stream_options",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            )
            return self._send(writer, 400, err)
        chat = rec.path.startswith("/v1/chat")
        surface = SURFACE_PATHS[rec.path.split("?")[0]]
        refusal = context_refusal(req, script)
        if refusal is not None:
            return self._send(writer, 400, refusal)
        if not req.get("stream"):
            if surface == "responses":
                body = final_response(req, script)
            elif surface == "messages":
                body = final_message(req, script)
            else:
                body = self._non_stream(req, chat, script)
            return self._send(writer, 200, orjson.dumps(body))

        head = (
            "HTTP/1.1 200 OK\r\ndate: Mon, 01 Jan 2024 00:00:00 GMT\r\nserver: uvicorn\r\n"
            "content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        writer.write(head.encode())
        gone = asyncio.Event()

        async def watch() -> None:
            # The client sends nothing while a response streams: EOF means it went away.
            try:
                data = await reader.read(1)
            except ConnectionError:
                data = b""
            if data:  # a pipelined request: give the byte back for the next readuntil
                reader._buffer[0:0] = data  # type: ignore[attr-defined]
                return
            rec.disconnected = time.monotonic()
            gone.set()

        watcher = asyncio.create_task(watch())
        sizes = list(script.write_sizes or [])
        pending = b""
        try:
            if surface == "responses":
                events = responses_events(req, script)
            elif surface == "messages":
                events = messages_events(req, script)
            else:
                header = rec.headers.get("x-request-id") if script.ids_from_request else None
                events = self._events(req, chat, script, header)
            for i, event in enumerate(events):
                delay = script.first_delay if i == 0 else script.chunk_delay
                if delay and event is not None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(gone.wait(), delay)
                if gone.is_set():
                    return False
                if event is None:  # die here
                    writer.transport.abort()
                    return False
                rec.chunks_sent += 1
                if sizes:
                    pending += event
                    while pending and len(pending) >= sizes[0]:
                        n = sizes[0]
                        sizes.append(sizes.pop(0))
                        self._chunk(writer, pending[:n])
                        pending = pending[n:]
                else:
                    self._chunk(writer, event)
                await writer.drain()
                await asyncio.sleep(0)
            if pending:
                self._chunk(writer, pending)
            if script.tail_delay:
                await writer.drain()
                await asyncio.sleep(script.tail_delay)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            rec.completed = True
        except ConnectionError:
            rec.disconnected = rec.disconnected or time.monotonic()
            return False
        finally:
            if not watcher.done():
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        return not gone.is_set()

    @staticmethod
    def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(b"%x\r\n" % len(data) + data + b"\r\n")

    # ------------------------------------------------------------------ vLLM payloads
    def _events(
        self, req: dict[str, Any], chat: bool, script: Script, request_id: str | None = None
    ) -> list[bytes | None]:
        if script.raw_stream is not None:
            return [script.raw_stream]
        n = int(req.get("n") or 1)
        opts = req.get("stream_options") or {}
        usage = bool(opts.get("include_usage"))
        continuous = usage and bool(opts.get("continuous_usage_stats"))
        rid = script.response_id or ("chatcmpl-" if chat else "cmpl-") + (
            request_id or "fake0123456789"
        )
        obj = "chat.completion.chunk" if chat else "text_completion"
        created = script.created
        model = req.get("model") or script.model
        pt = script.prompt_tokens
        counts = [0] * n
        events: list[bytes | None] = []

        def emit(index: int, choice: dict[str, Any]) -> None:
            chunk: dict[str, Any] = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": model,
                "choices": [choice],
            }
            if continuous:
                ct = counts[index]
                chunk["usage"] = {
                    "prompt_tokens": pt,
                    "total_tokens": pt + ct,
                    "completion_tokens": ct,
                }
            elif not chat:
                # vLLM writes completions chunks with exclude_unset=False: "usage": null.
                chunk["usage"] = None
            events.append(b"data: " + orjson.dumps(chunk) + b"\n\n")

        streams: list[list[tuple[str, str]]] = []
        for i in range(n):
            text = script.texts[min(i, len(script.texts) - 1)]
            items: list[tuple[str, str]] = []
            if script.reasoning and chat:
                items += [("reasoning", t) for t in tokenize(script.reasoning)]
            items += [("content" if chat else "text", t) for t in tokenize(text)]
            if script.tool_call and chat:
                name, args = script.tool_call
                items.append(("tool_name", name))
                items += [("tool", a) for a in re.findall(r".{1,6}", args, re.S)]
            streams.append(items)
        if chat:
            for i in range(n):
                emit(
                    i,
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    },
                )
        longest = max(len(s) for s in streams)
        token_no = 0
        for step in range(longest):
            for i in range(n):
                if step >= len(streams[i]):
                    continue
                kind, piece = streams[i][step]
                counts[i] += 1
                token_no += 1
                if chat:
                    if kind == "tool_name":
                        delta: dict[str, Any] = {
                            "tool_calls": [
                                {
                                    "id": "chatcmpl-tool-1",
                                    "type": "function",
                                    "index": 0,
                                    "function": {"name": piece},
                                }
                            ]
                        }
                    elif kind == "tool":
                        delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
                    else:
                        delta = {kind: piece}
                    emit(
                        i,
                        {"index": i, "delta": delta, "logprobs": None, "finish_reason": None},
                    )
                else:
                    emit(
                        i,
                        {
                            "index": i,
                            "text": piece,
                            "logprobs": None,
                            "finish_reason": None,
                            "stop_reason": None,
                        },
                    )
                if script.die_after is not None and token_no >= script.die_after:
                    events.append(None)
                    return events
                if script.mid_stream_error is not None and token_no >= script.mid_stream_error:
                    err = {
                        "error": {
                            "message": "engine failure",
                            "type": "InternalServerError",
                            "param": None,
                            "code": 500,
                        }
                    }
                    events.append(b"data: " + orjson.dumps(err) + b"\n\n")
                    events.append(b"data: [DONE]\n\n")
                    return events
        for i in range(n):
            if chat:
                last: dict[str, Any] = {
                    "index": i,
                    "delta": {"content": ""},
                    "logprobs": None,
                    "finish_reason": script.finish_reason,
                    "stop_reason": None,
                }
            else:
                last = {
                    "index": i,
                    "text": "",
                    "logprobs": None,
                    "finish_reason": script.finish_reason,
                    "stop_reason": None,
                }
            emit(i, last)
        if usage:
            total = sum(counts)
            final = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": model,
                "choices": [],
                "usage": {
                    "prompt_tokens": pt,
                    "total_tokens": pt + total,
                    "completion_tokens": total,
                },
            }
            events.append(b"data: " + orjson.dumps(final) + b"\n\n")
        events.append(b"data: [DONE]\n\n")
        return events

    def _non_stream(self, req: dict[str, Any], chat: bool, script: Script) -> dict[str, Any]:
        n = int(req.get("n") or 1)
        choices = []
        total = 0
        for i in range(n):
            text = script.texts[min(i, len(script.texts) - 1)]
            total += len(tokenize(text))
            if chat:
                message: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": []}
                if script.reasoning:
                    message["reasoning"] = script.reasoning
                    total += len(tokenize(script.reasoning))
                choices.append(
                    {
                        "index": i,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": script.finish_reason,
                        "stop_reason": None,
                    }
                )
            else:
                choices.append(
                    {
                        "index": i,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": script.finish_reason,
                        "stop_reason": None,
                    }
                )
        pt = script.prompt_tokens
        return {
            "id": ("chatcmpl-" if chat else "cmpl-") + "fake0123456789",
            "object": "chat.completion" if chat else "text_completion",
            "created": 1700000000,
            "model": req.get("model") or script.model,
            "choices": choices,
            "usage": {"prompt_tokens": pt, "total_tokens": pt + total, "completion_tokens": total},
        }


SURFACE_PATHS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}

# ---------------------------------------------------------------------- Responses API
# Shapes recorded from vLLM 0.32 (SmolLM2-135M-Instruct, tests/streams/responses_*.sse): named
# events, compact JSON with "type" last, sequence numbers from 0, no [DONE]; the terminal event is
# response.completed even when the status is "incomplete" (max_output_tokens).

RESPONSE_ID = "resp_fake0123456789"


def _response_object(req: dict[str, Any], script: Script, status: str) -> dict[str, Any]:
    own = req.get("request_id") if script.ids_from_request else None
    return {
        "id": own if isinstance(own, str) else RESPONSE_ID,
        "created_at": 1700000000,
        "incomplete_details": None,
        "instructions": req.get("instructions"),
        "metadata": None,
        "model": req.get("model") or script.model,
        "object": "response",
        "output": [],
        "parallel_tool_calls": True,
        "temperature": req.get("temperature", 1.0),
        "tool_choice": "auto" if req.get("tools") else "none",
        "tools": req.get("tools") or [],
        "top_p": req.get("top_p", 1.0),
        "background": False,
        "max_output_tokens": req.get("max_output_tokens"),
        "previous_response_id": None,
        "reasoning": None,
        "service_tier": "auto",
        "status": status,
        "text": None,
        "truncation": "disabled",
        "usage": None,
        "user": None,
    }


def context_refusal(req: dict[str, Any], script: Script) -> bytes | None:
    """vLLM's 400 for a limit that does not fit the context, in the wording of
    ``script.context_wording`` (vllm/renderers/params.py in 0.32; serving_engine.py before)."""
    length = script.max_model_len
    field = next(
        (f for f in ("max_completion_tokens", "max_tokens", "max_output_tokens") if req.get(f)),
        None,
    )
    if length is None or field is None:
        return None
    limit, prompt = req[field], script.prompt_tokens
    if script.context_wording == "0.32":
        if limit <= length:
            return None
        message = (
            f"{field}={limit} cannot be greater than max_model_len={length}. "
            "Please request fewer output tokens."
        )
    elif prompt + limit <= length:
        return None
    elif script.context_wording == "0.10":
        message = (
            f"'max_tokens' or 'max_completion_tokens' is too large: {limit}. This model's maximum "
            f"context length is {length} tokens and your request has {prompt} input tokens "
            f"({limit} > {length} - {prompt}). None"
        )
    else:
        message = (
            f"This model's maximum context length is {length} tokens. However, you requested "
            f"{prompt + limit} tokens ({prompt} in the messages, {limit} in the completion). "
            "Please reduce the length of the messages or completion."
        )
    error = {"message": message, "type": "BadRequestError", "param": field, "code": 400}
    return orjson.dumps({"error": error})


def _limited(req: dict[str, Any], script: Script, field: str) -> tuple[list[str], str, bool]:
    """(tokens, reasoning tokens split off first, whether the limit cut the answer)."""
    limit = req.get(field)
    tokens = tokenize(script.texts[0])
    if isinstance(limit, int) and len(tokens) > limit:
        return tokens[:limit], "length", True
    return tokens, script.finish_reason, script.finish_reason == "length"


def responses_events(req: dict[str, Any], script: Script) -> list[bytes | None]:
    """A streamed Responses answer: optional reasoning item, then the message item (or a
    function_call item when ``script.tool_call`` is set)."""
    events: list[bytes | None] = []
    seq = 0

    def emit(obj: dict[str, Any]) -> None:
        nonlocal seq
        obj["sequence_number"] = seq
        seq += 1
        kind = obj.pop("type")
        obj["type"] = kind
        events.append(f"event: {kind}\n".encode() + b"data: " + orjson.dumps(obj) + b"\n\n")

    tokens, finish, cut = _limited(req, script, "max_output_tokens")
    emit({"type": "response.created", "response": _response_object(req, script, "in_progress")})
    emit({"type": "response.in_progress", "response": _response_object(req, script, "in_progress")})
    output: list[dict[str, Any]] = []
    token_no = 0

    def die_here() -> bool:
        if script.die_after is not None and token_no >= script.die_after:
            events.append(None)
            return True
        if script.mid_stream_error is not None and token_no >= script.mid_stream_error:
            emit(
                {
                    "type": "error",
                    "code": "InternalServerError",
                    "message": "engine failure",
                    "param": None,
                }
            )
            return True
        return False

    items: list[tuple[str, list[str]]] = []
    if script.reasoning:
        items.append(("reasoning", tokenize(script.reasoning)))
    if script.tool_call:
        items.append(("function_call", re.findall(r".{1,6}", script.tool_call[1], re.S)))
    else:
        items.append(("message", tokens))
    for index, (kind, pieces) in enumerate(items):
        item_id = {"reasoning": "rs_", "message": "msg_", "function_call": "fc_"}[kind] + (
            f"fake{index:04d}"
        )
        if kind == "function_call":
            assert script.tool_call is not None
            item: dict[str, Any] = {
                "arguments": "",
                "call_id": "call_fake0",
                "name": script.tool_call[0],
                "type": "function_call",
                "id": item_id,
                "status": "in_progress",
            }
            emit({"type": "response.output_item.added", "item": item, "output_index": index})
            for piece in pieces:
                token_no += 1
                emit(
                    {
                        "type": "response.function_call_arguments.delta",
                        "delta": piece,
                        "item_id": item_id,
                        "output_index": index,
                    }
                )
                if die_here():
                    return events
            args = "".join(pieces)
            emit(
                {
                    "type": "response.function_call_arguments.done",
                    "arguments": args,
                    "item_id": item_id,
                    "name": script.tool_call[0],
                    "output_index": index,
                }
            )
            done = {**item, "arguments": args, "status": "completed"}
        else:
            if kind == "reasoning":
                item = {
                    "id": item_id,
                    "summary": [],
                    "type": "reasoning",
                    "content": None,
                    "encrypted_content": None,
                    "status": "in_progress",
                }
                part: dict[str, Any] = {"text": "", "type": "reasoning_text"}
                delta_type = "response.reasoning_text.delta"
            else:
                item = {
                    "id": item_id,
                    "content": [],
                    "role": "assistant",
                    "status": "in_progress",
                    "type": "message",
                    "phase": None,
                }
                part = {"annotations": [], "text": "", "type": "output_text", "logprobs": []}
                delta_type = "response.output_text.delta"
            emit({"type": "response.output_item.added", "item": item, "output_index": index})
            emit(
                {
                    "type": "response.content_part.added",
                    "content_index": 0,
                    "item_id": item_id,
                    "output_index": index,
                    "part": part,
                }
            )
            for piece in pieces:
                token_no += 1
                ev: dict[str, Any] = {
                    "type": delta_type,
                    "content_index": 0,
                    "delta": piece,
                    "item_id": item_id,
                }
                if kind == "message":
                    ev["logprobs"] = []
                ev["output_index"] = index
                emit(ev)
                if die_here():
                    return events
            text = "".join(pieces)
            done_ev: dict[str, Any] = {"content_index": 0, "item_id": item_id}
            if kind == "message":
                done_ev["type"] = "response.output_text.done"
                done_ev["logprobs"] = []
            else:
                done_ev["type"] = "response.reasoning_text.done"
            done_ev["output_index"] = index
            done_ev["text"] = text
            emit(done_ev)
            closed = {**part, "text": text}
            if kind == "message":
                closed["logprobs"] = None
            emit(
                {
                    "type": "response.content_part.done",
                    "content_index": 0,
                    "item_id": item_id,
                    "output_index": index,
                    "part": closed,
                }
            )
            done = {**item, "content": [closed], "status": "completed"}
        emit({"type": "response.output_item.done", "item": done, "output_index": index})
        output.append(done)
    final = final_response(req, script, output=output, tokens=token_no, cut=cut)
    emit({"type": "response.completed", "response": final})
    del finish
    return events


def final_response(
    req: dict[str, Any],
    script: Script,
    *,
    output: list[dict[str, Any]] | None = None,
    tokens: int | None = None,
    cut: bool | None = None,
) -> dict[str, Any]:
    """The Response object (the terminal event's, or a non-streamed answer)."""
    if output is None:
        words, _, cut = _limited(req, script, "max_output_tokens")
        text = "".join(words)
        output = [
            {
                "id": "msg_fake0000",
                "content": [
                    {"annotations": [], "text": text, "type": "output_text", "logprobs": None}
                ],
                "role": "assistant",
                "status": "completed",
                "type": "message",
                "phase": None,
            }
        ]
        tokens = len(words)
    obj = _response_object(req, script, "incomplete" if cut else "completed")
    if cut:
        obj["incomplete_details"] = {"reason": "max_output_tokens"}
    obj["output"] = output
    pt = script.prompt_tokens
    obj["usage"] = {
        "input_tokens": pt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": tokens or 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": pt + (tokens or 0),
    }
    return obj


# ---------------------------------------------------------------------- Anthropic Messages
# Shapes recorded from vLLM 0.32 (tests/streams/messages_*.sse): named events, "type" first.

MESSAGE_ID = "chatcmpl-fake0123456789"
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def messages_events(req: dict[str, Any], script: Script) -> list[bytes | None]:
    """A streamed Message: optional thinking block, a text block, optional tool_use block."""
    events: list[bytes | None] = []

    def emit(kind: str, obj: dict[str, Any]) -> None:
        events.append(
            f"event: {kind}\n".encode() + b"data: " + orjson.dumps({"type": kind, **obj}) + b"\n\n"
        )

    tokens, finish, _ = _limited(req, script, "max_tokens")
    pt = script.prompt_tokens
    emit(
        "message_start",
        {
            "message": {
                "id": MESSAGE_ID,
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": req.get("model") or script.model,
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": pt, "output_tokens": 0},
            }
        },
    )
    blocks: list[tuple[dict[str, Any], str, str, list[str]]] = []
    if script.reasoning:
        blocks.append(
            (
                {"type": "thinking", "thinking": "", "signature": ""},
                "thinking_delta",
                "thinking",
                tokenize(script.reasoning),
            )
        )
    blocks.append(({"type": "text", "text": ""}, "text_delta", "text", tokens))
    if script.tool_call:
        name, args = script.tool_call
        blocks.append(
            (
                {"type": "tool_use", "id": "toolu_fake0", "name": name, "input": {}},
                "input_json_delta",
                "partial_json",
                re.findall(r".{1,6}", args, re.S),
            )
        )
        finish = "tool_calls"
    token_no = 0
    for index, (start, delta_type, key, pieces) in enumerate(blocks):
        emit("content_block_start", {"content_block": start, "index": index})
        for piece in pieces:
            token_no += 1
            emit("content_block_delta", {"delta": {"type": delta_type, key: piece}, "index": index})
            if script.die_after is not None and token_no >= script.die_after:
                events.append(None)
                return events
            if script.mid_stream_error is not None and token_no >= script.mid_stream_error:
                emit("error", {"error": {"type": "api_error", "message": "engine failure"}})
                return events
        emit("content_block_stop", {"index": index})
    emit(
        "message_delta",
        {
            "delta": {"stop_reason": _STOP_REASONS.get(finish, "end_turn"), "stop_sequence": None},
            "usage": {"input_tokens": pt, "output_tokens": token_no},
        },
    )
    emit("message_stop", {})
    return events


def final_message(req: dict[str, Any], script: Script) -> dict[str, Any]:
    """A non-streamed Message as vLLM answers it."""
    tokens, finish, _ = _limited(req, script, "max_tokens")
    return {
        "id": MESSAGE_ID,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "".join(tokens)}],
        "model": req.get("model") or script.model,
        "stop_reason": _STOP_REASONS.get(finish, "end_turn"),
        "usage": {"input_tokens": script.prompt_tokens, "output_tokens": len(tokens)},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fake vLLM OpenAI-compatible server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--text-file", help="text to stream for every request")
    parser.add_argument("--chunk-delay", type=float, default=0.0, help="seconds per token")
    args = parser.parse_args(argv)
    fake = FakeVLLM(args.host, args.port)
    if args.text_file:
        with open(args.text_file, encoding="utf-8") as fh:
            fake.script = Script(texts=[fh.read()], chunk_delay=args.chunk_delay)
    else:
        fake.script = Script(chunk_delay=args.chunk_delay)
    fake.start()
    print(f"fake vLLM listening on {fake.url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        fake.stop()


if __name__ == "__main__":
    main()
