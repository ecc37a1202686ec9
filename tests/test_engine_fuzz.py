"""The served proxy (``coherence-guard serve``, a real subprocess) in front of a raw-socket engine
that answers each request with a seeded misbehaviour, clients sending requests with unique
markers 8 at a time. Every request must reach the engine once and come back as a 200 or a JSON
error carrying its own marker only, in time, with no transport error.

Adapted from the project's engine-side fuzzer (``fuzz/fuzz_upstream.py`` in the shared kit: the
same 13 behaviours and checks), with two changes: the engine runs in its own thread, and its
chunked bodies are built in linear time. The kit's engine shares one event loop with its clients
and builds the 6 MiB event's chunks by repeated ``bytes +=`` (quadratic: a minute on a busy
machine), which stalls both; while stalled, the clients' idle connections passed uvicorn's 5 s
keep-alive timeout and requests written on them were lost (see
``test_serve.py::test_an_idle_client_connection_outlives_the_clients_own_pool_expiry``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.net import HANG_GUARD, free_port, stop_process, wait_healthy

SCENARIOS = [
    "ok_chunked", "continue_then_ok", "ok_length", "truncated", "plain_text", "error_500",
    "chunk_ext", "trailers", "giant_event", "close_delimited", "no_response", "garbage_status",
    "two_events_one_chunk",
]  # fmt: skip
MARK = re.compile(r"MARK\d{5}X")


def sse(marker: str, n: int = 3) -> bytes:
    out = []
    for k in range(n):
        ev = {
            "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": f"{marker} part{k} "}, "logprobs": None,
                         "finish_reason": "stop" if k == n - 1 else None}],
        }  # fmt: skip
        out.append(b"data: " + json.dumps(ev).encode() + b"\n\n")
    return b"".join(out) + b"data: [DONE]\n\n"


def chunked(body: bytes, ext: bytes = b"", trailers: bytes = b"") -> bytes:
    parts = [
        b"%x%s\r\n%s\r\n" % (len(body[i : i + 97]), ext, body[i : i + 97])
        for i in range(0, len(body), 97)
    ]
    return b"".join(parts) + b"0\r\n" + trailers + b"\r\n"


class Engine:
    """The misbehaving engine, in its own thread and event loop."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.counter = 0
        self.seen: dict[str, int] = {}
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port)
        )
        self.ready.set()
        self.loop.run_forever()
        server.close()
        self.loop.run_until_complete(server.wait_closed())
        self.loop.close()

    def __enter__(self) -> Engine:
        self.thread.start()
        self.ready.wait(HANG_GUARD)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(HANG_GUARD)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                m = re.search(rb"content-length: *(\d+)", head, re.I)
                body = await reader.readexactly(int(m.group(1))) if m else b""
                if not head.startswith(b"POST /v1/chat/completions"):
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                marker = json.loads(body)["messages"][-1]["content"]
                self.seen[marker] = self.seen.get(marker, 0) + 1
                rnd = random.Random(self.seed * 100003 + self.counter)
                self.counter += 1
                if await self._answer(rnd.choice(SCENARIOS), marker, writer):
                    return
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, sc: str, marker: str, writer: asyncio.StreamWriter) -> bool:
        """Write the answer; True when the connection is to be closed."""
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        te = b"transfer-encoding: chunked\r\n\r\n"
        mk = marker.encode()
        if sc in ("ok_chunked", "two_events_one_chunk"):
            writer.write(head + te + chunked(sse(marker, 6 if sc != "ok_chunked" else 3)))
        elif sc == "continue_then_ok":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + head + te + chunked(sse(marker)))
        elif sc == "ok_length":
            b = sse(marker)
            writer.write(head + b"content-length: %d\r\n\r\n" % len(b) + b)
        elif sc == "truncated":
            b = chunked(sse(marker))
            writer.write(head + te + b[: len(b) // 2])
            return True
        elif sc == "plain_text":
            b = b"<html>" + mk + b" not an event stream</html>"
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n" % len(b)
                + b
            )
        elif sc == "error_500":
            b = json.dumps({"error": {"message": f"engine failed for {marker}", "code": 500}})
            writer.write(
                b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(b), b.encode())
            )
        elif sc == "chunk_ext":
            writer.write(head + te + chunked(sse(marker), ext=b";x=1"))
        elif sc == "trailers":
            writer.write(head + te + chunked(sse(marker), trailers=b"x-t: 1\r\n"))
        elif sc == "giant_event":
            ev = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                  "choices": [{"index": 0, "delta": {"content": marker + " " + "y" * (6 << 20)},
                               "finish_reason": None}]}  # fmt: skip
            data = b"data: " + json.dumps(ev).encode() + b"\n\n"
            writer.write(head + te + chunked(data + sse(marker)))
        elif sc == "close_delimited":
            writer.write(head + b"connection: close\r\n\r\n" + sse(marker))
            return True
        elif sc == "no_response":
            await asyncio.sleep(0.05)
            return True
        elif sc == "garbage_status":
            writer.write(b"HTTQ/9.9 abc\r\n\r\n" + mk)
            return True
        return False


async def _client_run(base: str, n: int, engine: Engine) -> list[tuple[object, ...]]:
    bad: list[tuple[object, ...]] = []
    async with httpx.AsyncClient(timeout=HANG_GUARD) as client:

        async def one(i: int) -> None:
            mk = f"MARK{i:05d}X"
            body = {"model": "m", "messages": [{"role": "user", "content": mk}]}
            started = time.monotonic()
            try:
                r = await client.post(
                    base + "/v1/chat/completions", json={**body, "stream": i % 3 != 0}
                )
            except httpx.HTTPError as exc:
                bad.append((i, "client error", type(exc).__name__, time.monotonic() - started))
                return
            if set(MARK.findall(r.text)) - {mk}:
                bad.append((i, "cross-talk"))
            if r.status_code != 200 and '"error"' not in r.text:
                bad.append((i, f"status {r.status_code} without a JSON error", r.text[:80]))
            if engine.seen.get(mk) != 1:
                bad.append((i, "reached the engine", engine.seen.get(mk, 0), "times"))

        for start in range(0, n, 8):
            await asyncio.gather(*(one(i) for i in range(start, min(n, start + 8))))
    return bad


@pytest.mark.parametrize("seed", [1, 2])
def test_misbehaving_engine_never_loses_or_mixes_a_request(seed: int, tmp_path: Path) -> None:
    n = int(os.environ.get("GUARD_ENGINE_FUZZ_REQUESTS", "48"))
    with Engine(seed) as engine:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GUARD_")}
        env.update(GUARD_UPSTREAM_METRICS_INTERVAL="0", GUARD_UPSTREAM_CHECK_INTERVAL="0")
        log = (tmp_path / "proxy.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--host", "127.0.0.1", "--port", str(port),
             "--upstream", f"http://127.0.0.1:{engine.port}"],
            env=env, stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            assert wait_healthy(base + "/health", alive=lambda: proc.poll() is None)
            bad = asyncio.run(_client_run(base, n, engine))
            assert httpx.get(base + "/health").status_code == 200
        finally:
            stop_process(proc)
            log.close()
        log_tail = (tmp_path / "proxy.log").read_text()[-3000:]
        assert bad == [], f"{bad}\n{log_tail}"
