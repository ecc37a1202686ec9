"""The connection to the engine: one pooled httpx client, and httpx errors translated at this
boundary into the proxy's own (:mod:`proxy.errors`).

Streams are opened with ``send(..., stream=True)`` and always closed with ``aclose()`` in the
caller's ``finally``: closing the response mid-body closes the TCP connection, which is what
makes vLLM abort the request and free its KV cache (a proxy that merely stops reading leaves the
GPU generating).
"""

from __future__ import annotations

from collections.abc import Iterable

import httpx

from proxy.errors import GuardError, UpstreamError, UpstreamTimeout

#: Hop-by-hop headers (RFC 9110 §7.6.1) plus the ones httpx recomputes; never forwarded.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


def base_url(url: str) -> str:
    """The engine's root URL. The proxy forwards whole paths (``/v1/...``, ``/health``), so a
    URL given the OpenAI way, ending in ``/v1``, loses that suffix."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def make_client(
    url: str,
    *,
    connect_timeout: float,
    read_timeout: float,
    max_connections: int = 1024,
) -> httpx.AsyncClient:
    base_url_ = base_url(url)
    return httpx.AsyncClient(
        base_url=base_url_,
        timeout=httpx.Timeout(read_timeout, connect=connect_timeout, pool=connect_timeout),
        limits=httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        ),
        # Relay the upstream's status and redirects as they are.
        follow_redirects=False,
        trust_env=False,
    )


def forward_headers(
    raw: Iterable[tuple[bytes, bytes]], *, drop: Iterable[str] = ()
) -> list[tuple[bytes, bytes]]:
    """Request/response headers minus hop-by-hop ones (and those named in ``drop``)."""
    skip = HOP_BY_HOP | {d.lower() for d in drop}
    return [(k, v) for k, v in raw if k.decode("latin-1").lower() not in skip]


def translate(exc: Exception) -> GuardError:
    """An httpx exception as the proxy's error: unreachable → 502, timeout → 504."""
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout("The upstream did not answer in time.", code="upstream_timeout")
    if isinstance(exc, httpx.ConnectError):
        return UpstreamError("The upstream is unreachable.", code="upstream_unreachable")
    if isinstance(exc, httpx.RemoteProtocolError):
        return UpstreamError(
            "The upstream closed the connection unexpectedly.", code="upstream_disconnected"
        )
    return UpstreamError(f"Upstream request failed: {type(exc).__name__}.", code="upstream_error")


def error_kind(exc: Exception) -> str:
    """The ``upstream_error`` metric label for an httpx exception."""
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect"
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
        return "disconnect"
    return "protocol"
