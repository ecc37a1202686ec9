"""TLS to the engine: one SSL context for every route. The guarded POSTs, pass-through and
``/ready`` trust the same CAs (``GUARD_UPSTREAM_CA_BUNDLE``, else the system store), skip
verification together (``GUARD_UPSTREAM_TLS_VERIFY=false``) and present the same client
certificate (mutual TLS) — against a real uvicorn engine serving https."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import trustme

from tests.net import HANG_GUARD
from tests.servers.engines import UvicornEngine

ProxyFactory = Callable[..., str]
BODY = {"model": "m", "messages": [{"role": "user", "content": "over tls"}]}


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def pems(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("tls")
    server = ca.issue_cert("127.0.0.1")
    client = ca.issue_cert("coherence-guard")
    paths = {
        "ca": d / "ca.pem",
        "server_cert": d / "server.pem",
        "server_key": d / "server.key",
        "client_cert": d / "client.pem",
        "client_key": d / "client.key",
    }
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.cert_chain_pems[0].write_to_path(str(paths["server_cert"]))
    server.private_key_pem.write_to_path(str(paths["server_key"]))
    client.cert_chain_pems[0].write_to_path(str(paths["client_cert"]))
    client.private_key_pem.write_to_path(str(paths["client_key"]))
    return {k: str(v) for k, v in paths.items()}


@pytest.fixture(scope="module")
def https_engine(pems: dict[str, str]) -> Iterator[UvicornEngine]:
    with UvicornEngine(ssl_certfile=pems["server_cert"], ssl_keyfile=pems["server_key"]) as e:
        yield e


@pytest.fixture(scope="module")
def mtls_engine(pems: dict[str, str]) -> Iterator[UvicornEngine]:
    with UvicornEngine(
        ssl_certfile=pems["server_cert"],
        ssl_keyfile=pems["server_key"],
        ssl_ca_certs=pems["ca"],
        ssl_cert_reqs=ssl.CERT_REQUIRED,
    ) as e:
        yield e


def routes(base: str) -> tuple[int, int, int]:
    """Status of a guarded POST, a pass-through GET and /ready."""
    guarded = httpx.post(base + "/v1/chat/completions", json=BODY, timeout=HANG_GUARD)
    if guarded.status_code == 200:
        assert guarded.json()["choices"][0]["message"]["content"] == "over tls"
    passthrough = httpx.get(base + "/v1/models", timeout=HANG_GUARD)
    ready = httpx.get(base + "/ready", timeout=HANG_GUARD)
    return guarded.status_code, passthrough.status_code, ready.status_code


def test_ca_bundle_is_trusted_by_every_route(
    proxy_server: ProxyFactory, https_engine: UvicornEngine, pems: dict[str, str]
) -> None:
    base = proxy_server(upstream_url=https_engine.url, upstream_ca_bundle=pems["ca"])
    assert routes(base) == (200, 200, 200)


def test_unknown_ca_is_refused_by_every_route(
    proxy_server: ProxyFactory, https_engine: UvicornEngine
) -> None:
    base = proxy_server(upstream_url=https_engine.url)
    guarded, passthrough, ready = routes(base)
    assert (guarded, passthrough, ready) == (502, 502, 503)


def test_verification_off_applies_to_every_route(
    proxy_server: ProxyFactory, https_engine: UvicornEngine
) -> None:
    base = proxy_server(upstream_url=https_engine.url, upstream_tls_verify=False)
    assert routes(base) == (200, 200, 200)


def test_client_certificate_is_presented_on_every_route(
    proxy_server: ProxyFactory, mtls_engine: UvicornEngine, pems: dict[str, str]
) -> None:
    base = proxy_server(
        upstream_url=mtls_engine.url,
        upstream_ca_bundle=pems["ca"],
        upstream_client_cert=pems["client_cert"],
        upstream_client_key=pems["client_key"],
    )
    assert routes(base) == (200, 200, 200)
    without = proxy_server(upstream_url=mtls_engine.url, upstream_ca_bundle=pems["ca"])
    guarded, passthrough, ready = routes(without)
    assert guarded == 502 and passthrough == 502 and ready == 503


def test_missing_ca_bundle_fails_at_start_up(tmp_path: Path) -> None:
    from proxy.server.upstream import UpstreamConfig

    with pytest.raises(OSError):
        UpstreamConfig.create("https://engine:8000", ca_bundle=str(tmp_path / "nope.pem"))
