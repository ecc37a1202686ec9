"""The connection to the engine, configured once: :class:`UpstreamConfig`.

One frozen object holds everything about reaching the engine — base URL, one
:class:`ssl.SSLContext` (built once: verification on unless ``GUARD_UPSTREAM_TLS_VERIFY=false``,
``GUARD_UPSTREAM_CA_BUNDLE``, mutual TLS), connect/read/write timeouts, the connection limit and
the key the proxy sends (``GUARD_UPSTREAM_API_KEY``). Both clients are built from it, so the
guarded routes, pass-through, ``/ready`` and the vLLM config watcher trust the same CAs, time
out alike and fail with the same errors:

* the guarded POSTs use the hand-written client in :mod:`proxy.server.upstream_http`
  (:meth:`UpstreamClient.from_config <proxy.server.upstream_http.UpstreamClient.from_config>`);
* everything else uses httpx (:meth:`UpstreamConfig.httpx_client`), whose errors
  :func:`httpx_failure` translates into the same :class:`~proxy.errors.UpstreamFailure`.

Headers sent upstream go through :meth:`UpstreamConfig.forward_headers` on every route:
hop-by-hop headers (RFC 9110 §7.6.1), the ones named in ``Connection``, ``Expect`` and
``TE`` never reach the engine. ``Expect: 100-continue`` in particular would make the engine
send an interim ``100 Continue`` the proxy never asked for (see FACTS.md, "HTTP details").

Streams are always closed with ``aclose()`` in the caller's ``finally``: closing a response
mid-body closes the TCP connection, which is what makes vLLM abort the request and free its KV
cache (a proxy that merely stops reading leaves the GPU generating).
"""

from __future__ import annotations

import functools
import logging
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import httpx

from proxy.errors import GuardError, UpstreamError, UpstreamFailure, UpstreamTimeout

if TYPE_CHECKING:
    from proxy.observability.metrics import Metrics

log = logging.getLogger("coherence_guard")

__all__ = [
    "CLIENT_CREDENTIALS",
    "HOP_BY_HOP",
    "FailureKind",
    "UpstreamConfig",
    "UpstreamFailure",
    "base_url",
    "build_ssl_context",
    "error_kind",
    "failure",
    "forward_headers",
    "httpx_failure",
    "translate",
]

#: Never forwarded in either direction: hop-by-hop headers (RFC 9110 §7.6.1), ``Expect`` (the
#: proxy reads the whole request body before it sends anything; an engine asked to
#: ``100-continue`` would answer with an interim response first), and the framing headers the
#: sending side recomputes (``host``, ``content-length``).
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
        "expect",
        "host",
        "content-length",
    }
)

#: The headers a client authenticates with (OpenAI's SDKs: ``Authorization``; Anthropic's:
#: ``x-api-key``): never forwarded when the proxy sends the engine its own key.
CLIENT_CREDENTIALS = ("authorization", "x-api-key")

#: Seconds a pooled connection may stay idle and still be reused, in both clients: below the
#: 5 s keep-alive timeout of uvicorn (vLLM's server), so the proxy drops a connection before the
#: engine does instead of racing the engine's close with a new request.
KEEPALIVE_EXPIRY = 4.0

#: Methods whose request may be sent again when the engine closed the connection without an
#: answer (RFC 9110 §9.2.2: idempotent; a proxy may retry them automatically). A POST may have
#: started work on the engine, so it is never sent twice.
RESENDABLE = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})

FailureKind = Literal["connect", "timeout", "disconnect", "protocol"]

_FAILURES: dict[str, tuple[type[UpstreamError], str, str]] = {
    "connect": (UpstreamError, "The upstream is unreachable.", "upstream_unreachable"),
    "timeout": (UpstreamTimeout, "The upstream did not answer in time.", "upstream_timeout"),
    "disconnect": (
        UpstreamError,
        "The upstream closed the connection unexpectedly.",
        "upstream_disconnected",
    ),
    "protocol": (
        UpstreamError,
        "The upstream sent an invalid HTTP response.",
        "upstream_protocol_error",
    ),
}


def failure(kind: FailureKind, message: str | None = None) -> UpstreamFailure:
    """The one translation of every way an upstream exchange can fail: unreachable → 502,
    timeout → 504, disconnect / protocol → 502 (``kind`` is also the metrics label)."""
    cls, default, code = _FAILURES[kind]
    return UpstreamFailure(cls(message or default, code=code), kind)


def httpx_failure(exc: Exception) -> UpstreamFailure:
    """An httpx exception as the same failure the guarded routes' client raises."""
    if isinstance(exc, httpx.TimeoutException):
        return failure("timeout")
    if isinstance(exc, httpx.ConnectError):
        return failure("connect")
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return failure("disconnect")
    return failure("protocol", f"Upstream request failed: {type(exc).__name__}.")


def translate(exc: Exception) -> GuardError:
    """An httpx exception as the proxy's error (see :func:`httpx_failure`)."""
    return httpx_failure(exc).error


def error_kind(exc: Exception) -> str:
    """The ``upstream_error`` metric label for an httpx exception."""
    return httpx_failure(exc).kind


def base_url(url: str) -> str:
    """The engine's root URL. The proxy forwards whole paths (``/v1/...``, ``/health``), so a
    URL given the OpenAI way, ending in ``/v1``, loses that suffix."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def forward_headers(
    raw: Iterable[tuple[bytes, bytes]], *, drop: Iterable[str] = ()
) -> list[tuple[bytes, bytes]]:
    """Headers minus hop-by-hop ones, minus those the ``Connection`` header names, minus
    ``drop``. Used for requests on every route (guarded and pass-through)."""
    pairs = list(raw)
    skip = _skipped(drop if isinstance(drop, tuple) else tuple(drop))
    for name, value in pairs:
        if name.lower() == b"connection":
            skip |= {t.strip().lower() for t in value.decode("latin-1").split(",") if t.strip()}
    return [(k, v) for k, v in pairs if k.decode("latin-1").lower() not in skip]


@functools.lru_cache(maxsize=64)
def _skipped(drop: tuple[str, ...]) -> frozenset[str]:
    """The header names never forwarded with ``drop``: built once per call site (each passes
    the same few names on every request), not once per request."""
    return HOP_BY_HOP | {d.lower() for d in drop}


def build_ssl_context(
    *,
    verify: bool = True,
    ca_bundle: str | None = None,
    client_cert: str | None = None,
    client_key: str | None = None,
) -> ssl.SSLContext:
    """The one TLS context for the engine. The system store (``ssl``'s defaults, not certifi)
    unless ``ca_bundle`` names a PEM file; ``client_cert``/``client_key`` for mutual TLS."""
    ctx = ssl.create_default_context(cafile=ca_bundle)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if client_cert:
        ctx.load_cert_chain(client_cert, client_key)
    return ctx


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamConfig:
    """How to reach the engine; read once at start-up, shared by both clients."""

    url: str
    ssl: ssl.SSLContext
    connect_timeout: float = 5.0
    read_timeout: float = 600.0
    write_timeout: float = 30.0
    max_connections: int = 1024
    api_key: str | None = None

    @classmethod
    def create(
        cls,
        url: str,
        *,
        tls_verify: bool = True,
        ca_bundle: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        **options: Any,
    ) -> UpstreamConfig:
        """From plain values (``options``: the timeouts, ``max_connections``, ``api_key``)."""
        ctx = build_ssl_context(
            verify=tls_verify, ca_bundle=ca_bundle, client_cert=client_cert, client_key=client_key
        )
        return cls(url=base_url(url), ssl=ctx, **options)

    @classmethod
    def from_settings(cls, settings: Any) -> UpstreamConfig:
        """From :class:`proxy.settings.Settings` (the ``GUARD_UPSTREAM_*`` and timeout fields)."""
        return cls.create(
            settings.upstream_url,
            tls_verify=settings.upstream_tls_verify,
            ca_bundle=settings.upstream_ca_bundle,
            client_cert=settings.upstream_client_cert,
            client_key=settings.upstream_client_key,
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
            write_timeout=settings.write_timeout,
            max_connections=settings.upstream_max_connections,
            api_key=settings.upstream_api_key,
        )

    @property
    def auth_header(self) -> tuple[bytes, bytes] | None:
        """``Authorization`` the proxy sends in place of the client's, when a key is set."""
        if not self.api_key:
            return None
        return (b"authorization", b"Bearer " + self.api_key.encode("latin-1"))

    def forward_headers(
        self, raw: Iterable[tuple[bytes, bytes]], *, drop: Iterable[str] = ()
    ) -> list[tuple[bytes, bytes]]:
        """:func:`forward_headers`, with the client's credentials (``Authorization`` and
        Anthropic's ``x-api-key``, which the proxy accepts too) replaced by the proxy's own key
        when ``GUARD_UPSTREAM_API_KEY`` is set: the engine trusts the proxy's key, so nothing a
        client sends may ride along with it."""
        auth = self.auth_header
        if auth is None:
            return forward_headers(raw, drop=drop)
        out = forward_headers(raw, drop=(*drop, *CLIENT_CREDENTIALS))
        out.append(auth)
        return out

    def httpx_client(self) -> httpx.AsyncClient:
        """The pooled httpx client for pass-through, readiness and the config watcher."""
        auth = self.auth_header
        transport = httpx.AsyncHTTPTransport(
            verify=self.ssl,
            limits=httpx.Limits(
                max_connections=self.max_connections,
                max_keepalive_connections=self.max_connections,
                keepalive_expiry=KEEPALIVE_EXPIRY,
            ),
            trust_env=False,
        )
        return httpx.AsyncClient(
            base_url=self.url,
            transport=ResendIdempotent(transport),
            timeout=httpx.Timeout(
                connect=self.connect_timeout,
                read=self.read_timeout,
                write=self.write_timeout,
                pool=self.connect_timeout,
            ),
            headers=None if auth is None else {"authorization": auth[1].decode("latin-1")},
            # Relay the upstream's status and redirects as they are.
            follow_redirects=False,
            trust_env=False,
        )


class ResendIdempotent(httpx.AsyncBaseTransport):
    """The httpx client's transport: an idempotent request the engine closed or reset the
    connection on, or answered with something that is not HTTP, is sent once more.

    A pooled connection the engine closes just as it is reused (uvicorn's idle timeout, an engine
    restart) leaves a request unanswered; every user of the client (pass-through, the model
    look-up, readiness) would otherwise report a failure for a request the engine never answered.
    httpx drops the failed connection, so the second try goes out on another one; a second
    failure is the caller's. A POST may have started work on the engine: never sent twice.
    """

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self._inner.handle_async_request(request)
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
            if request.method not in RESENDABLE:
                raise
            log.debug("engine closed the connection unanswered; sending the request again")
            return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def upstream_failed(metrics: Metrics, kind: str, status: int = 0) -> str:
    """Count and log an upstream failure (never any text; the request id is in the context);
    returns what failed, as a span's ``error.type`` names it: the kind, or the engine's status.

    An engine 4xx is the client's mistake relayed (info); 5xx, timeouts and broken
    connections are the deployment's problem (warning)."""
    metrics.upstream_error(kind)
    if not status:
        log.warning("upstream failed (kind=%s)", kind)
        return kind
    if status >= 500:
        log.warning("upstream answered %d", status)
    else:
        log.info("upstream answered %d", status)
    return str(status)
