"""The guarded routes' client against two real HTTP servers (uvicorn, aiohttp.web) speaking
vLLM's wire format: streamed answers, keep-alive reuse, and ``100 Continue`` straight from
uvicorn when a request carries ``Expect`` (the client skips it even if a caller forwards it)."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from proxy.core.sse import SSEParser
from proxy.server.upstream_http import UpstreamClient
from tests.servers.engines import AiohttpEngine, UvicornEngine

HEADERS = [(b"content-type", b"application/json")]


@pytest.fixture(params=["uvicorn", "aiohttp"], scope="module")
def engine_url(request: pytest.FixtureRequest) -> Iterator[str]:
    engine = UvicornEngine() if request.param == "uvicorn" else AiohttpEngine()
    with engine:
        yield engine.url


def texts(raw: bytes) -> str:
    parser = SSEParser()
    out = []
    for event in parser.feed(raw) + parser.close():
        if event.data is None or event.is_done:
            continue
        for choice in orjson.loads(event.data)["choices"]:
            out.append(choice["text"])
    return "".join(out)


@pytest.mark.parametrize("expect", [False, True], ids=["plain", "expect-100-continue"])
async def test_alternating_requests_get_their_own_streamed_answers(
    engine_url: str, expect: bool
) -> None:
    up = UpstreamClient.for_url(engine_url, connect_timeout=2, read_timeout=5)
    headers = HEADERS + ([(b"expect", b"100-continue")] if expect else [])
    for n in range(40):
        prompt = f"request number {n} for user {n % 2}"
        body = orjson.dumps({"model": "m", "prompt": prompt, "stream": True})
        resp = await up.post("/v1/completions", headers if n % 2 else HEADERS, body)
        assert resp.status_code == 200
        raw = await resp.aread()
        await resp.aclose()
        assert raw.endswith(b"data: [DONE]\n\n")
        assert texts(raw) == prompt
    assert up.idle_connections == 1, "every exchange ended cleanly and the connection was kept"
    await up.aclose()
