"""One upstream configuration: what it reads from the settings, which headers it lets through,
and the one translation of failures both clients share."""

from __future__ import annotations

import ssl

import httpx
import pytest

from proxy.server.upstream import UpstreamConfig, forward_headers, httpx_failure
from proxy.server.upstream_http import UpstreamClient
from proxy.settings import load_settings


def test_from_settings_reads_every_upstream_field() -> None:
    settings = load_settings(
        upstream_url="https://engine.internal:8443/v1/",
        connect_timeout=1.5,
        read_timeout=42,
        write_timeout=7,
        upstream_max_connections=9,
        upstream_api_key="k",
        upstream_tls_verify=False,
    )
    config = UpstreamConfig.from_settings(settings)
    assert config.url == "https://engine.internal:8443"
    assert (config.connect_timeout, config.read_timeout, config.write_timeout) == (1.5, 42, 7)
    assert config.max_connections == 9
    assert config.ssl.verify_mode == ssl.CERT_NONE and not config.ssl.check_hostname
    fast = UpstreamClient(config)
    assert fast.ssl is config.ssl, "one SSL context for both clients"
    assert (fast.host, fast.port, fast.host_header) == (
        "engine.internal",
        8443,
        b"engine.internal:8443",
    )


def test_verification_is_on_by_default() -> None:
    config = UpstreamConfig.from_settings(load_settings(upstream_url="https://e"))
    assert config.ssl.verify_mode == ssl.CERT_REQUIRED and config.ssl.check_hostname


RAW = [
    (b"Host", b"proxy"),
    (b"Expect", b"100-continue"),
    (b"TE", b"trailers"),
    (b"Connection", b"keep-alive, X-Private , x-other"),
    (b"x-private", b"1"),
    (b"X-Other", b"2"),
    (b"Keep-Alive", b"timeout=HANG_GUARD"),
    (b"Transfer-Encoding", b"chunked"),
    (b"Content-Length", b"3"),
    (b"Upgrade", b"h2c"),
    (b"Proxy-Authorization", b"Basic x"),
    (b"authorization", b"Bearer client"),
    (b"x-kept", b"yes"),
]


def test_forward_headers_drop_hop_by_hop_expect_te_and_connection_listed() -> None:
    assert forward_headers(RAW) == [(b"authorization", b"Bearer client"), (b"x-kept", b"yes")]
    assert forward_headers(RAW, drop=("X-Kept",)) == [(b"authorization", b"Bearer client")]


def test_api_key_replaces_the_clients_authorization() -> None:
    with_key = UpstreamConfig.create("http://e", api_key="engine")
    assert with_key.forward_headers(RAW) == [
        (b"x-kept", b"yes"),
        (b"authorization", b"Bearer engine"),
    ]
    without = UpstreamConfig.create("http://e")
    assert (b"authorization", b"Bearer client") in without.forward_headers(RAW)


async def test_httpx_client_carries_the_key_and_timeouts() -> None:
    config = UpstreamConfig.create(
        "http://e:1/v1", api_key="engine", read_timeout=3, write_timeout=4
    )
    async with config.httpx_client() as client:
        assert str(client.base_url) == "http://e:1"
        assert client.headers["authorization"] == "Bearer engine"
        assert client.timeout.read == 3 and client.timeout.write == 4


@pytest.mark.parametrize(
    ("exc", "kind", "status", "code"),
    [
        (httpx.ConnectError("x"), "connect", 502, "upstream_unreachable"),
        (httpx.ConnectTimeout("x"), "timeout", 504, "upstream_timeout"),
        (httpx.ReadTimeout("x"), "timeout", 504, "upstream_timeout"),
        (httpx.RemoteProtocolError("x"), "disconnect", 502, "upstream_disconnected"),
        (httpx.ReadError("x"), "disconnect", 502, "upstream_disconnected"),
        (httpx.UnsupportedProtocol("x"), "protocol", 502, "upstream_protocol_error"),
    ],
)
def test_httpx_errors_translate_like_the_fast_clients(
    exc: Exception, kind: str, status: int, code: str
) -> None:
    failure = httpx_failure(exc)
    assert (failure.kind, failure.error.status, failure.error.code) == (kind, status, code)
