"""The floor of any Python relay: a TCP byte pipe on uvloop, no HTTP, no ASGI, no guard.

A benchmark target for the kit's ``run.py`` (``--proxy 'floor=python
bench/measure/relay/floor_relay.py --port {port} --upstream {upstream}'``), never a mode of the
product. Each client connection gets its own connection to the engine and every read is written to
the other side as it came: one ``recv``, one ``send`` and one event-loop callback per chunk, the
least work a relay written in Python on asyncio can do. nginx parses HTTP and re-frames the chunked
body; this does neither. So the CPU per chunk it costs beside nginx in the same run bounds what the
ratio targets can ask of a Python proxy: whatever uvicorn, the ASGI layer, the upstream client and
the guard add comes on top of it.

    python bench/measure/relay/floor_relay.py --host 127.0.0.1 --port 8080 --upstream http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
from typing import cast
from urllib.parse import urlsplit

import uvloop


class _Upstream(asyncio.Protocol):
    """The engine side: every read goes to the client as it came."""

    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class _Client(asyncio.Protocol):
    """The client side: bytes that arrive before the engine's connection is open wait for it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.upstream: asyncio.Transport | None = None
        self.pending: list[bytes] = []
        self.connecting: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.connecting = asyncio.ensure_future(self._connect())  # kept: a task needs a holder

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        client = cast(asyncio.Transport, self.transport)  # uvloop's is not a subclass
        upstream, _ = await loop.create_connection(lambda: _Upstream(client), self.host, self.port)
        self.upstream = upstream
        for data in self.pending:
            upstream.write(data)
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.pending.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def _serve(host: str, port: int, upstream: str) -> None:
    target = urlsplit(upstream)
    up_host, up_port = target.hostname or "127.0.0.1", target.port or 80
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(up_host, up_port), host, port)
    async with server:
        await server.serve_forever()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--upstream", required=True, help="the engine's base URL")
    args = ap.parse_args()
    uvloop.run(_serve(args.host, args.port, args.upstream))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
