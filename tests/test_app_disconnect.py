"""A client that goes away makes the proxy close the upstream (so vLLM aborts) before the engine
is done. The events are awaited (the engine's connection closed mid-answer), each with the hang
guard only: how fast it happens is a benchmark's business, not a test's."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest

from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD

ProxyFactory = Callable[..., str]
_ROWS = (Path(__file__).parent / "data" / "corpus.jsonl").read_text().splitlines()
#: A healthy answer of a few hundred tokens: at 10 ms a token it is still streaming when the
#: client leaves.
TEXT = next(r["text"] for r in map(json.loads, _ROWS) if r["label"] == "healthy")
#: Thousands of tokens (a minute at 10 ms each): the engine is never done before the client left.
LONG = " ".join([TEXT] * 20)


async def test_streaming_client_disconnect_closes_the_upstream(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    fake_upstream.script = Script(texts=[TEXT], chunk_delay=0.01)
    base = proxy_server()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    client = httpx.AsyncClient(base_url=base)
    async with client, client.stream("POST", "/v1/chat/completions", json=body) as resp:
        async for _ in resp.aiter_raw():
            break  # got some data; now walk away
        rec = fake_upstream.guarded_requests()[0]
        assert rec.chunks_sent > 0 and rec.disconnected is None
    assert fake_upstream.wait_for(lambda: rec.disconnected is not None)
    assert not rec.completed


async def test_non_streaming_client_disconnect_closes_the_upstream(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """The client gives up while the proxy is still collecting the answer."""
    fake_upstream.script = Script(texts=[LONG], chunk_delay=0.01)
    base = proxy_server()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=base) as client:
        asking = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        # Leave once the engine is answering (the proxy is collecting), not after a time.
        deadline = time.monotonic() + HANG_GUARD
        while not (
            fake_upstream.guarded_requests() and fake_upstream.guarded_requests()[0].chunks_sent
        ):
            assert time.monotonic() < deadline and not asking.done()
            await asyncio.sleep(0.005)
        asking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asking
    rec = fake_upstream.guarded_requests()[0]
    assert fake_upstream.wait_for(lambda: rec.disconnected is not None)
    assert not rec.completed


def test_raw_socket_disconnect_during_a_slow_first_token(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """The client leaves before any byte was relayed (long prefill)."""
    fake_upstream.script = Script(texts=[TEXT], first_delay=HANG_GUARD)
    base = proxy_server()
    port = int(base.rsplit(":", 1)[1])
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        # The first request the engine sees may be the proxy's model lookup, not the chat call.
        assert fake_upstream.wait_for(lambda: bool(fake_upstream.guarded_requests()))
    rec = fake_upstream.guarded_requests()[0]
    assert fake_upstream.wait_for(lambda: rec.disconnected is not None)  # before its first token
