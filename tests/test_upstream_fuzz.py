"""Fuzzing the guarded routes' client with upstream byte streams (hypothesis): random framing,
interim responses, chunk extensions and trailers, random TCP cuts, truncation, bytes past the
end, garbage. Every outcome is the exact body or an :class:`UpstreamFailure` (whichever the
bytes call for), never a hang; the next request always gets exactly its own answer; no
connection or pool slot is left behind."""

from __future__ import annotations

import asyncio
import itertools
import os
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.server.upstream_http import UpstreamClient, UpstreamFailure
from tests.servers.raw import RawConn, RawServer, chunked, response

HEADERS = [(b"content-type", b"application/json")]
INTERIM = [
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 102 Processing\r\n\r\n",
    b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n",
]


@dataclass
class Case:
    body: bytes
    framing: str  # length | chunked | close
    interim: list[bytes]
    sizes: list[int]
    ext: bytes
    trailers: bytes
    fault: str  # none | truncate | extra | garbage
    at: int
    extra: bytes
    cuts: list[int]

    def head(self) -> bytes:
        return b"".join(self.interim)

    def wire(self) -> bytes:
        if self.framing == "length":
            final = response(self.body)
        elif self.framing == "chunked":
            final = chunked(self.body, self.sizes, ext=self.ext, trailers=self.trailers)
        else:
            final = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + self.body
        data = self.head() + final
        if self.fault == "truncate":
            return data[: self.at % len(data)]
        if self.fault == "extra":
            return data + self.extra
        if self.fault == "garbage":
            return b"XGARBAGE " + self.extra + data
        return data

    def closes(self) -> bool:
        return self.framing == "close" or self.fault in ("truncate", "garbage")

    def expected(self) -> bytes | None:
        """The body the client must return, or None for a failure."""
        if self.fault == "garbage":
            return None
        if self.fault == "truncate":
            data = self.wire()
            if self.framing != "close":
                return None
            final_head = len(self.head()) + len(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n")
            return None if len(data) < final_head else data[final_head:]
        if self.fault == "extra" and self.framing == "close":
            return self.body + self.extra
        return self.body


CASES = st.builds(
    Case,
    body=st.binary(max_size=300),
    framing=st.sampled_from(["length", "chunked", "close"]),
    interim=st.lists(st.sampled_from(INTERIM), max_size=2),
    sizes=st.lists(st.integers(1, 64), min_size=1, max_size=5),
    ext=st.sampled_from([b"", b";a=b", b';name="v"']),
    trailers=st.sampled_from([b"", b"x-t: 1\r\n", b"x-t: 1\r\nx-u: 2\r\n"]),
    fault=st.sampled_from(["none", "truncate", "extra", "garbage"]),
    at=st.integers(min_value=0),
    extra=st.one_of(
        st.binary(min_size=1, max_size=40),
        st.just(response(b"LEAKED")),
    ),
    cuts=st.lists(st.integers(min_value=0), max_size=6),
)


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


async def exchange(case: Case) -> None:
    wire = case.wire()

    async def handle(conn: RawConn) -> None:
        first = conn.index == 0
        while (req := await conn.request()) is not None:
            if first:
                first = False
                if case.fault == "extra":
                    # Past-the-end bytes ride with the response's last bytes (in a later
                    # write they could race the next request: a property of HTTP/1.1 itself).
                    parts = pieces(wire[: -len(case.extra)], case.cuts)
                    parts[-1:] = [(parts[-1] if parts else b"") + case.extra]
                else:
                    parts = pieces(wire, case.cuts)
                for part in parts:
                    await conn.write(part)
                    await asyncio.sleep(0)
                if case.closes():
                    conn.close()
                    return
            else:
                await conn.write(response(b"answer to " + req))

    async with RawServer(handle) as server:
        up = UpstreamClient.for_url(server.url, connect_timeout=1, read_timeout=2)
        async with asyncio.timeout(5):  # never a hang
            expected = case.expected()
            try:
                resp = await up.post("/v1/completions", HEADERS, b"first")
                try:
                    got: bytes | None = await resp.aread()
                finally:
                    await resp.aclose()
            except UpstreamFailure:
                got = None
            assert got == expected
            if got is not None:
                assert resp.status_code == 200
            resp2 = await up.post("/v1/completions", HEADERS, b"second")
            assert await resp2.aread() == b"answer to second"
            await resp2.aclose()
            assert up._slots._value == up.config.max_connections  # every slot given back
            assert up.idle_connections <= 1
            await up.aclose()
            await server.all_closed()  # the client left no connection open


@settings(max_examples=int(os.environ.get("GUARD_FUZZ_EXAMPLES", "120")), deadline=None)
@given(CASES)
def test_any_upstream_bytes_give_the_exact_body_or_a_failure_never_a_leak(case: Case) -> None:
    asyncio.run(exchange(case))
