"""The guarded routes' HTTP/1.1 client against real sockets: keep-alive, stale connections,
body framings, failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from proxy.server.upstream_http import UpstreamClient, UpstreamFailure
from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD

BODY = orjson.dumps({"model": "m", "prompt": "x", "stream": True})
HEADERS = [(b"content-type", b"application/json")]


def client(url: str, read_timeout: float = 5) -> UpstreamClient:
    return UpstreamClient.for_url(url, connect_timeout=2, read_timeout=read_timeout)


async def test_keep_alive_reuses_one_connection(fake_upstream: FakeVLLM) -> None:
    up = client(fake_upstream.url)
    for _ in range(3):
        resp = await up.post("/v1/completions", HEADERS, BODY)
        assert resp.status_code == 200
        assert (await resp.aread()).endswith(b"data: [DONE]\n\n")
        await resp.aclose()
    assert len({r.peer for r in fake_upstream.requests}) == 1
    await up.aclose()


async def test_connection_closed_while_idle_is_replaced(fake_upstream: FakeVLLM) -> None:
    up = client(fake_upstream.url)
    resp = await up.post("/v1/completions", HEADERS, BODY)
    await resp.aread()
    await resp.aclose()
    await asyncio.to_thread(fake_upstream.drop_idle_connections)
    resp = await up.post("/v1/completions", HEADERS, BODY)
    assert (await resp.aread()).endswith(b"data: [DONE]\n\n")
    assert len({r.peer for r in fake_upstream.requests}) == 2
    await up.aclose()


async def test_aclose_mid_body_aborts_the_connection(fake_upstream: FakeVLLM) -> None:
    fake_upstream.script = Script(texts=["a b c d e f g h i j k l m n o p"], chunk_delay=0.05)
    up = client(fake_upstream.url)
    resp = await up.post("/v1/completions", HEADERS, BODY)
    assert await resp.read()
    await resp.aclose()
    rec = fake_upstream.last
    assert await asyncio.to_thread(fake_upstream.wait_for, lambda: rec.disconnected is not None)
    assert not rec.completed
    await up.aclose()


async def test_unreachable_and_timeout_failures(fake_upstream: FakeVLLM) -> None:
    with pytest.raises(UpstreamFailure) as err:
        await client("http://127.0.0.1:1").post("/v1/completions", HEADERS, BODY)
    assert err.value.kind == "connect" and err.value.error.status == 502
    fake_upstream.script = Script(hang=True)
    with pytest.raises(UpstreamFailure) as err:
        await client(fake_upstream.url, read_timeout=0.2).post("/v1/completions", HEADERS, BODY)
    assert err.value.kind == "timeout" and err.value.error.status == 504


async def _serve_raw(payload: bytes) -> AsyncIterator[str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(payload)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    ("payload", "body"),
    [
        (b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\ndata: a\n\n", b"data: a\n\n"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", b"hello"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", b"abc"),
    ],
    ids=["close-delimited", "content-length", "chunked"],
)
async def test_body_framings(payload: bytes, body: bytes) -> None:
    async for url in _serve_raw(payload):
        resp = await client(url).post("/v1/completions", HEADERS, BODY)
        assert await resp.aread() == body


@pytest.mark.parametrize(
    "payload",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n",
        b"NOT HTTP AT ALL\r\n\r\n",
    ],
    ids=["short-content-length", "unterminated-chunked", "garbage"],
)
async def test_broken_responses_fail_cleanly(payload: bytes) -> None:
    async for url in _serve_raw(payload):
        with pytest.raises(UpstreamFailure):
            resp = await client(url).post("/v1/completions", HEADERS, BODY)
            await resp.aread()


async def test_relay_hands_each_read_to_the_callback_then_read_takes_over(
    fake_upstream: FakeVLLM,
) -> None:
    """``relay`` delivers from the protocol callback until the callback says stop; the bytes
    after that are ``read``'s, nothing lost, nothing twice, in order; the pooled connection is
    reused after the end."""
    fake_upstream.script = Script(texts=["a b c d e f g h i j k l"], chunk_delay=0.01)
    up = client(fake_upstream.url)
    direct = await up.post("/v1/completions", HEADERS, BODY)
    whole = await direct.aread()
    await direct.aclose()

    resp = await up.post("/v1/completions", HEADERS, BODY)
    seen: list[bytes] = []

    def on_data(data: bytes) -> bool:
        seen.append(data)
        return len(seen) < 4

    await resp.relay(on_data)
    assert len(seen) == 4
    rest = await resp.aread()
    assert b"".join(seen) + rest == whole
    await resp.aclose()
    assert up.idle_connections == 1

    resp = await up.post("/v1/completions", HEADERS, BODY)
    got: list[bytes] = []

    def keep(data: bytes) -> bool:
        got.append(data)
        return True  # never stops: runs to the end

    await resp.relay(keep)
    assert b"".join(got) == whole
    assert await resp.read() == b""
    await resp.aclose()
    assert len({r.peer for r in fake_upstream.requests}) == 1
    await up.aclose()


async def test_relay_times_out_and_reports_failures(fake_upstream: FakeVLLM) -> None:
    """The read timeout holds while relaying; a dropped connection is ``read``'s failure after
    ``relay`` returns."""
    fake_upstream.script = Script(texts=["a b c"], first_delay=0.5)
    up = client(fake_upstream.url, read_timeout=0.2)
    resp = await up.post("/v1/completions", HEADERS, BODY)
    with pytest.raises(UpstreamFailure) as err:
        await resp.relay(lambda data: True)
    assert err.value.kind == "timeout"
    await resp.aclose()

    fake_upstream.script = Script(texts=["a b c d e f g h"], chunk_delay=0.05, die_after=3)
    up = client(fake_upstream.url, read_timeout=HANG_GUARD)  # not what this half is about
    resp = await up.post("/v1/completions", HEADERS, BODY)
    parts: list[bytes] = []

    def keep_part(data: bytes) -> bool:
        parts.append(data)
        return True

    await resp.relay(keep_part)
    assert parts
    with pytest.raises(UpstreamFailure) as err:
        await resp.read()
    assert err.value.kind == "disconnect"
    await resp.aclose()
    await up.aclose()
