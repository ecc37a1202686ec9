#!/usr/bin/env python3
# Vendored unchanged from the workplace's shared relay benchmark kit (bench/fake_upstream.py there)
# so the project's fault benchmark runs from a fresh clone; kept out of ruff (its own style).
"""Fast fake OpenAI-compatible (vLLM-flavoured) upstream for proxy benchmarks.

Plain asyncio Protocol code (uvloop when installed), a hand-written HTTP/1.1
parser and pre-encoded byte fragments, so that a reverse proxy in front of it
is the bottleneck, not this server.

Endpoints
  POST /v1/chat/completions   streaming (SSE) or JSON, vLLM wire format
  POST /v1/completions        streaming (SSE) or JSON, vLLM wire format
  GET  /v1/models             one model (the --model name)
  GET  /health                200, empty body (like vLLM)
  GET  /stats[?reset=1]       JSON counters: started/completed/disconnected...
  GET|POST /control?k=v...    change defaults at run time (delay_ms, ttft_ms,
                              default_tokens, max_tokens_cap, finish, loop_after)

Per-request overrides (query string of the POST, or header x-fake-<name>):
  delay_ms      inter-token delay in ms (0 = as fast as flow control allows)
  ttft_ms       delay before the first token (default: = delay_ms)
  finish        finish_reason of the last chunk: "length" (default) or "stop"
  loop_after    after this many tokens, repeat one fixed phrase (a "narrative
                loop", for exercising abort paths of a guarding proxy); -1 = off
Tokens per response = request "max_tokens" (or "max_completion_tokens"), else
--default-tokens; capped by --max-tokens-cap.

Wire format (chat, stream=true), one HTTP chunk per SSE event, as vLLM+uvicorn:
  data: {"id":"chatcmpl-..","object":"chat.completion.chunk","created":T,"model":"M","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}
  data: {..."choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}
  ...
  data: {..."choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":"length","stop_reason":null}]}
  [data: {...,"choices":[],"usage":{...}}   only with stream_options.include_usage]
  data: [DONE]

Client disconnects are noticed (connection_lost) and the generation stops at
once; /stats counts them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import time
import uuid
from urllib.parse import parse_qsl

try:  # optional speedups
    import orjson

    def jdumps(o) -> bytes:
        return orjson.dumps(o)

    jloads = orjson.loads
except ImportError:  # pragma: no cover
    def jdumps(o) -> bytes:
        return json.dumps(o, separators=(",", ":")).encode()

    jloads = json.loads

WORDS = (
    "the quick brown fox jumps over a lazy dog while seven bright engineers "
    "measure latency across busy networks and quiet kernels tonight because "
    "every stream deserves careful attention from start to finish so we write "
    "small tokens one after another into sockets that carry them through "
    "proxies gateways balancers and caches toward patient readers who wait "
    "for meaning rather than noise indeed language models produce words like "
    "these at steady rates when their caches stay warm and their schedulers "
    "remain fair under pressure from thousands of concurrent requests arriving "
    "from clients around the world each asking questions about history science "
    "cooking poetry mathematics travel music gardening finance medicine law "
    "philosophy astronomy chemistry biology geology economics art sport games"
).split()
# JSON-escaped (trivially: plain ascii words) token texts with a leading space
TOKENS = [(" " + w).encode() for w in WORDS]
LOOP_PHRASE = [(" " + w).encode() for w in
               "and then the story began again from the very first page".split()]

# --text-file: healthy, non-periodic text (one word a token, JSON-escaped, leading space)
TEXT_TOKENS: list = []
TEXT_CURSOR = 0


def load_text_tokens(path: str) -> list:
    """Words of a text file, or of the healthy English 'text' fields of a JSONL corpus."""
    words = []
    with open(path, encoding="utf-8") as f:
        if path.endswith(".jsonl"):
            for line in f:
                d = json.loads(line)
                if d.get("label", "healthy") == "healthy" and d.get("lang") in (None, "en") \
                        and d.get("kind") in (None, "llm-answer", "prose", "technical"):
                    words.extend(d["text"].split())
        else:
            words = f.read().split()
    return [json.dumps(" " + w, ensure_ascii=False)[1:-1].encode() for w in words]


DEFAULTS = {
    "delay_ms": 0.0,
    "ttft_ms": None,  # None -> same as delay_ms
    "default_tokens": 64,
    "max_tokens_cap": 1_000_000,
    "finish": "length",
    "loop_after": -1,
}

STATS = {
    "requests": 0,         # HTTP requests of any kind (incl. /stats, /control)
    "completion_requests": 0,  # POST /v1/chat/completions + /v1/completions
    "started": 0,          # streaming responses started
    "completed": 0,        # streaming responses that sent [DONE]
    "disconnected": 0,     # streaming responses cut by the client before [DONE]
    "active": 0,           # streaming responses in flight
    "nonstream_started": 0,
    "nonstream_completed": 0,
    "nonstream_disconnected": 0,
    "chunks_sent": 0,      # SSE events written (incl. role chunk and [DONE])
    "bytes_sent": 0,
    "connections": 0,      # TCP connections accepted
    "bad_requests": 0,
}
STATS_ZERO = dict(STATS)
T_START = time.time()

HDR_SSE = (b"HTTP/1.1 200 OK\r\n"
           b"server: fake-vllm\r\n"
           b"content-type: text/event-stream; charset=utf-8\r\n"
           b"transfer-encoding: chunked\r\n")
CRLF = b"\r\n"
LAST_CHUNK = b"0\r\n\r\n"
DONE_EVENT = b"data: [DONE]\n\n"
DONE_FRAMED = b"%x\r\n%s\r\n" % (len(DONE_EVENT), DONE_EVENT)


def frame(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def http_response(status: int, body: bytes, ctype: bytes = b"application/json",
                  keep_alive: bool = True) -> bytes:
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found",
              405: b"Method Not Allowed", 413: b"Payload Too Large"}.get(status, b"X")
    return (b"HTTP/1.1 %d %s\r\nserver: fake-vllm\r\ncontent-type: %s\r\n"
            b"content-length: %d\r\n%s\r\n" % (
                status, reason, ctype, len(body),
                b"" if keep_alive else b"connection: close\r\n")) + body


def oai_error(status: int, msg: str) -> bytes:
    return jdumps({"object": "error", "message": msg, "type": "BadRequestError",
                   "param": None, "code": status})


class Generation:
    """State of one in-flight completion (streaming or not)."""

    __slots__ = ("proto", "stream", "chat", "n", "i", "prefix", "suffix", "final_suffix",
                 "delay", "t0", "handle", "loop_after", "usage_chunk", "done", "nonstream_body",
                 "keep_alive", "pending", "text_start")

    def __init__(self, proto, stream, chat, n, model, delay, ttft, finish, loop_after,
                 include_usage, prompt_tokens, keep_alive):
        self.proto = proto
        proto.gen = self  # before anything can complete synchronously
        self.pending = b""
        self.stream = stream
        self.chat = chat
        self.n = n
        self.i = 0
        self.delay = delay
        self.loop_after = loop_after
        global TEXT_CURSOR
        # healthy text: each generation starts somewhere else in the text file (if any)
        self.text_start = TEXT_CURSOR
        TEXT_CURSOR = (TEXT_CURSOR + 7919) % max(1, len(TEXT_TOKENS))
        self.handle = None
        self.done = False
        self.keep_alive = keep_alive
        created = int(time.time())
        rid = uuid.uuid4().hex
        model_b = jdumps(model)
        if chat:
            head = (b'{"id":"chatcmpl-%s","object":"chat.completion.chunk","created":%d,'
                    b'"model":%s,"choices":[' % (rid.encode(), created, model_b))
            self.prefix = b"data: " + head + b'{"index":0,"delta":{"content":"'
            self.suffix = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
            self.final_suffix = (b'"},"logprobs":null,"finish_reason":"%s","stop_reason":null}]}\n\n'
                                 % finish.encode())
            role = (b"data: " + head +
                    b'{"index":0,"delta":{"role":"assistant","content":""},'
                    b'"logprobs":null,"finish_reason":null}]}\n\n')
        else:
            head = (b'{"id":"cmpl-%s","object":"text_completion","created":%d,'
                    b'"model":%s,"choices":[' % (rid.encode(), created, model_b))
            self.prefix = b"data: " + head + b'{"index":0,"text":"'
            self.suffix = b'","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
            self.final_suffix = (b'","logprobs":null,"finish_reason":"%s","stop_reason":null}]}\n\n'
                                 % finish.encode())
            role = None
        self.usage_chunk = None
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n,
                 "completion_tokens": n}
        if stream and include_usage:
            self.usage_chunk = frame(b"data: " + head + b'],"usage":' + jdumps(usage) + b"}\n\n")
        loop = proto.loop
        self.t0 = loop.time() + ttft
        if stream:
            STATS["started"] += 1
            STATS["active"] += 1
            # headers go out at once (like uvicorn's StreamingResponse); vLLM's role chunk
            # is only produced together with the first token, after "prefill" (ttft)
            proto.write(HDR_SSE + (b"" if keep_alive else b"connection: close\r\n") + CRLF)
            self.pending = frame(role) if role is not None else b""
            if n == 0:
                self.finish_stream()
            elif ttft <= 0 and delay <= 0:
                self.handle = loop.call_soon(self.step_fast)
            else:
                self.handle = loop.call_at(self.t0, self.step_timed)
        else:
            STATS["nonstream_started"] += 1
            # tokens are JSON-escaped fragments for the SSE path: unescape once for the JSON body
            text = json.loads(b'"' + b"".join(self.token(k) for k in range(n)) + b'"')
            if chat:
                body = {"id": "chatcmpl-" + rid, "object": "chat.completion", "created": created,
                        "model": model,
                        "choices": [{"index": 0,
                                     "message": {"role": "assistant", "content": text,
                                                 "tool_calls": []},
                                     "logprobs": None, "finish_reason": finish,
                                     "stop_reason": None}],
                        "usage": usage, "prompt_logprobs": None}
            else:
                body = {"id": "cmpl-" + rid, "object": "text_completion", "created": created,
                        "model": model,
                        "choices": [{"index": 0, "text": text, "logprobs": None,
                                     "finish_reason": finish, "stop_reason": None,
                                     "prompt_logprobs": None}],
                        "usage": usage}
            self.nonstream_body = jdumps(body)
            total = ttft + max(0, n - 1) * delay
            if total <= 0:
                self.finish_nonstream()
            else:
                self.handle = loop.call_later(total, self.finish_nonstream)

    def token(self, k: int) -> bytes:
        la = self.loop_after
        if 0 <= la <= k:
            return LOOP_PHRASE[(k - la) % len(LOOP_PHRASE)]
        toks = TEXT_TOKENS or TOKENS
        return toks[(self.text_start + k) % len(toks)]

    def chunk(self, k: int) -> bytes:
        suffix = self.final_suffix if k == self.n - 1 else self.suffix
        payload = self.prefix + self.token(k) + suffix
        return b"%x\r\n%s\r\n" % (len(payload), payload)

    # --- streaming -------------------------------------------------------
    def step_fast(self):
        """Zero delay: one chunk per event-loop turn, honouring flow control."""
        self.handle = None
        p = self.proto
        if self.done or p.closed:
            return
        if p.paused:
            p.on_resume = self.step_fast
            return
        k = self.i
        if self.pending:
            p.write(self.pending + self.chunk(k))
            self.pending = b""
            STATS["chunks_sent"] += 2
        else:
            p.write(self.chunk(k))
            STATS["chunks_sent"] += 1
        self.i = k + 1
        if self.i >= self.n:
            self.finish_stream()
        else:
            self.handle = p.loop.call_soon(self.step_fast)

    def step_timed(self):
        """Fixed schedule: token k is due at t0 + k*delay (no drift)."""
        self.handle = None
        p = self.proto
        if self.done or p.closed:
            return
        loop = p.loop
        now = loop.time()
        out = []
        if self.pending:
            out.append(self.pending)
            self.pending = b""
        # catch up if late (never more than what is due)
        while self.i < self.n and self.t0 + self.i * self.delay <= now + 1e-4:
            out.append(self.chunk(self.i))
            self.i += 1
        if out:
            p.write(b"".join(out) if len(out) > 1 else out[0])
            STATS["chunks_sent"] += len(out)
        if self.i >= self.n:
            self.finish_stream()
        else:
            self.handle = loop.call_at(self.t0 + self.i * self.delay, self.step_timed)

    def finish_stream(self):
        p = self.proto
        tail = [self.pending, DONE_FRAMED, LAST_CHUNK]  # pending: role chunk if n == 0
        if self.usage_chunk is not None:
            tail.insert(0, self.usage_chunk)
            STATS["chunks_sent"] += 1
        p.write(b"".join(tail))
        STATS["chunks_sent"] += 1
        self.done = True
        STATS["completed"] += 1
        STATS["active"] -= 1
        p.generation_done(self)

    def finish_nonstream(self):
        self.handle = None
        p = self.proto
        if p.closed:
            return
        p.write(http_response(200, self.nonstream_body, keep_alive=self.keep_alive))
        self.done = True
        STATS["nonstream_completed"] += 1
        p.generation_done(self)

    def abort(self):
        """Connection lost before the end."""
        if self.done:
            return
        self.done = True
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        if self.stream:
            STATS["disconnected"] += 1
            STATS["active"] -= 1
        else:
            STATS["nonstream_disconnected"] += 1


class HttpProto(asyncio.Protocol):
    __slots__ = ("loop", "transport", "buf", "closed", "paused", "on_resume", "gen",
                 "bytes_out")

    def __init__(self, loop):
        self.loop = loop
        self.transport = None
        self.buf = bytearray()
        self.closed = False
        self.paused = False
        self.on_resume = None
        self.gen = None

    # transport callbacks -------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
        STATS["connections"] += 1
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        transport.set_write_buffer_limits(high=256 * 1024, low=64 * 1024)

    def connection_lost(self, exc):
        self.closed = True
        if self.gen is not None:
            self.gen.abort()
            self.gen = None

    def eof_received(self):
        # client half-closed: treat like a disconnect of any in-flight generation
        return False

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        cb, self.on_resume = self.on_resume, None
        if cb is not None:
            self.loop.call_soon(cb)

    def write(self, data: bytes):
        STATS["bytes_sent"] += len(data)
        self.transport.write(data)

    def data_received(self, data):
        self.buf += data
        if self.gen is None:
            self.process()
        elif len(self.buf) > 1 << 20:
            self.transport.close()

    # HTTP ------------------------------------------------------------------
    def generation_done(self, gen):
        self.gen = None
        if not gen.keep_alive:
            self.transport.close()
            return
        if self.buf:
            self.loop.call_soon(self.process)

    def bad(self, status, msg, close=True):
        STATS["bad_requests"] += 1
        self.transport.write(http_response(status, oai_error(status, msg), keep_alive=not close))
        if close:
            self.buf.clear()
            self.transport.close()

    def process(self):
        """Parse as many complete requests as are buffered (one at a time)."""
        while self.gen is None and not self.closed and self.buf:
            buf = self.buf
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > 65536:
                    self.bad(400, "header too large")
                return
            head = bytes(buf[:end]).decode("latin-1")
            lines = head.split("\r\n")
            try:
                method, target, version = lines[0].split(" ", 2)
            except ValueError:
                self.bad(400, "bad request line")
                return
            headers = {}
            for ln in lines[1:]:
                k, _, v = ln.partition(":")
                headers[k.strip().lower()] = v.strip()
            pos = end + 4
            te = headers.get("transfer-encoding", "").lower()
            if "chunked" in te:
                body, consumed = self.dechunk(buf, pos)
                if body is None:
                    if consumed < 0:
                        self.bad(400, "bad chunked body")
                    return  # need more data
                del buf[:consumed]
            else:
                try:
                    clen = int(headers.get("content-length", "0") or 0)
                except ValueError:
                    self.bad(400, "bad content-length")
                    return
                if clen > 16 << 20:
                    self.bad(413, "body too large")
                    return
                if len(buf) < pos + clen:
                    return
                body = bytes(buf[pos:pos + clen])
                del buf[:pos + clen]
            conn = headers.get("connection", "").lower()
            keep_alive = ("close" not in conn) and (version != "HTTP/1.0" or "keep-alive" in conn)
            STATS["requests"] += 1
            self.handle_request(method, target, headers, body, keep_alive)
            if not keep_alive and self.gen is None:
                self.transport.close()
                return

    @staticmethod
    def dechunk(buf, pos):
        out = bytearray()
        while True:
            nl = buf.find(b"\r\n", pos)
            if nl < 0:
                return None, 0
            try:
                size = int(bytes(buf[pos:nl]).split(b";")[0], 16)
            except ValueError:
                return None, -1
            pos = nl + 2
            if size == 0:
                # skip trailers
                end = buf.find(b"\r\n\r\n", pos - 2)
                if end < 0:
                    return None, 0
                return bytes(out), end + 4
            if len(buf) < pos + size + 2:
                return None, 0
            out += buf[pos:pos + size]
            pos += size + 2

    def handle_request(self, method, target, headers, body, keep_alive):
        path, _, qs = target.partition("?")
        q = dict(parse_qsl(qs)) if qs else {}
        t = self.transport
        if path in ("/v1/chat/completions", "/v1/completions"):
            STATS["completion_requests"] += 1
            if method != "POST":
                t.write(http_response(405, oai_error(405, "method not allowed"), keep_alive=keep_alive))
                return
            try:
                req = jloads(body) if body else {}
                if not isinstance(req, dict):
                    raise ValueError("body is not an object")
            except Exception as e:  # noqa: BLE001
                self.bad(400, f"invalid JSON body: {e}", close=not keep_alive)
                return
            chat = path == "/v1/chat/completions"
            if chat and not isinstance(req.get("messages"), list):
                self.bad(400, "'messages' is required", close=not keep_alive)
                return

            def opt(name, default):
                v = q.get(name)
                if v is None:
                    v = headers.get("x-fake-" + name.replace("_", "-"))
                return default if v is None else v

            try:
                delay = float(opt("delay_ms", DEFAULTS["delay_ms"])) / 1000.0
                ttft_d = DEFAULTS["ttft_ms"]
                ttft = float(opt("ttft_ms", ttft_d if ttft_d is not None else delay * 1000)) / 1000.0
                loop_after = int(opt("loop_after", DEFAULTS["loop_after"]))
                finish = str(opt("finish", DEFAULTS["finish"]))
                n = req.get("max_tokens")
                if n is None:
                    n = req.get("max_completion_tokens")
                n = int(DEFAULTS["default_tokens"] if n is None else n)
            except (TypeError, ValueError) as e:
                self.bad(400, f"bad parameter: {e}", close=not keep_alive)
                return
            if finish not in ("length", "stop"):
                finish = "length"
            n = max(0, min(n, int(DEFAULTS["max_tokens_cap"])))
            stream = bool(req.get("stream", False))
            so = req.get("stream_options") or {}
            include_usage = bool(so.get("include_usage")) if isinstance(so, dict) else False
            if chat:
                prompt_tokens = sum(len(str(m.get("content", "")).split())
                                    for m in req["messages"] if isinstance(m, dict)) + 4
            else:
                prompt_tokens = len(str(req.get("prompt", "")).split()) + 1
            model = req.get("model") or ARGS.model
            # Generation registers itself as self.gen and clears it when done
            Generation(self, stream, chat, n, str(model), max(0.0, delay), max(0.0, ttft),
                       finish, loop_after, include_usage, prompt_tokens, keep_alive)
            return
        if path == "/stats":
            snap = dict(STATS)
            snap["uptime_s"] = round(time.time() - T_START, 3)
            snap["defaults"] = DEFAULTS
            if q.get("reset") in ("1", "true", "yes"):
                for k, v in STATS_ZERO.items():
                    if k != "active":
                        STATS[k] = v
            t.write(http_response(200, jdumps(snap), keep_alive=keep_alive))
            return
        if path == "/control":
            try:
                for k, v in q.items():
                    if k not in DEFAULTS:
                        raise ValueError(f"unknown key {k}")
                    if k == "finish":
                        DEFAULTS[k] = v
                    elif k in ("default_tokens", "max_tokens_cap", "loop_after"):
                        DEFAULTS[k] = int(v)
                    else:
                        DEFAULTS[k] = None if v in ("", "none") else float(v)
            except ValueError as e:
                self.bad(400, str(e), close=not keep_alive)
                return
            t.write(http_response(200, jdumps(DEFAULTS), keep_alive=keep_alive))
            return
        if path == "/health":
            t.write(http_response(200, b"", keep_alive=keep_alive))
            return
        if path == "/v1/models":
            body = {"object": "list", "data": [{"id": ARGS.model, "object": "model",
                                                "created": int(T_START), "owned_by": "vllm",
                                                "root": ARGS.model, "parent": None,
                                                "max_model_len": 131072}]}
            t.write(http_response(200, jdumps(body), keep_alive=keep_alive))
            return
        t.write(http_response(404, b'{"detail":"Not Found"}', keep_alive=keep_alive))


ARGS = None


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default=os.environ.get("FAKE_HOST", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("FAKE_PORT", "18000")))
    ap.add_argument("--model", default=os.environ.get("FAKE_MODEL", "fake"))
    ap.add_argument("--delay-ms", type=float, default=float(os.environ.get("FAKE_DELAY_MS", "0")))
    ap.add_argument("--ttft-ms", type=float,
                    default=(float(os.environ["FAKE_TTFT_MS"]) if "FAKE_TTFT_MS" in os.environ else None),
                    help="delay before first token (default: = delay-ms)")
    ap.add_argument("--default-tokens", type=int, default=int(os.environ.get("FAKE_TOKENS", "64")),
                    help="tokens when the request has no max_tokens")
    ap.add_argument("--max-tokens-cap", type=int,
                    default=int(os.environ.get("FAKE_MAX_TOKENS_CAP", "1000000")))
    ap.add_argument("--finish", default=os.environ.get("FAKE_FINISH", "length"),
                    choices=["length", "stop"])
    ap.add_argument("--loop-after", type=int, default=int(os.environ.get("FAKE_LOOP_AFTER", "-1")))
    ap.add_argument("--text-file", default=os.environ.get("FAKE_TEXT_FILE", ""),
                    help="stream the words of this text (or healthy English texts of a .jsonl "
                         "corpus) instead of cycling a 150-word list, which a loop detector "
                         "would rightly flag after 150 tokens")
    ap.add_argument("--no-uvloop", action="store_true")
    ap.add_argument("--backlog", type=int, default=4096)
    ARGS = ap.parse_args()
    if ARGS.text_file:
        TEXT_TOKENS.extend(load_text_tokens(ARGS.text_file))
    DEFAULTS.update(delay_ms=ARGS.delay_ms, ttft_ms=ARGS.ttft_ms,
                    default_tokens=ARGS.default_tokens, max_tokens_cap=ARGS.max_tokens_cap,
                    finish=ARGS.finish, loop_after=ARGS.loop_after)
    if not ARGS.no_uvloop:
        try:
            import uvloop
            uvloop.install()
        except ImportError:
            pass
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    server = loop.run_until_complete(loop.create_server(
        lambda: HttpProto(loop), ARGS.host, ARGS.port, backlog=ARGS.backlog, reuse_address=True))
    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, loop.stop)
    print(f"fake_upstream listening on http://{ARGS.host}:{ARGS.port} "
          f"loop={type(loop).__module__} defaults={DEFAULTS}", flush=True)
    try:
        loop.run_forever()
    finally:
        server.close()
        print("fake_upstream stats " + json.dumps(STATS), flush=True)


if __name__ == "__main__":
    sys.exit(main())
