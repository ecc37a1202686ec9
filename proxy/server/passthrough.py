"""Everything that is not a guarded route nor the proxy's own: relayed to the engine as it is.

Method, canonical path, query, headers minus hop-by-hop ones, body; status, headers (an absolute
``Location`` naming the engine made relative), streaming body. Runs under the same bounds as the
guarded routes (disconnect, write timeout, deadline: see :mod:`proxy.server.bounds`). An
idempotent request the engine closed the connection on unanswered is sent once more
(:class:`proxy.server.upstream.ResendIdempotent`); a POST never is.

Engine routes that generate text without being guarded
(:data:`proxy.server.paths.UNGUARDED_GENERATING`) come here too unless GUARD_UNGUARDED_ROUTES=reject
(then the dispatcher answers 403).
"""

from __future__ import annotations

import time

import httpx

from proxy.errors import GuardError
from proxy.server import upstream
from proxy.server.asgi import (
    REQUEST_ID,
    ClientGone,
    Receive,
    Scope,
    Send,
    cut_response,
    read_body,
    response_headers,
    scope_headers,
    send_error,
)
from proxy.server.bounds import Watch, deadline_error, watched
from proxy.server.paths import wire_path
from proxy.server.state import Proxy
from proxy.server.upstream import upstream_failed


class Passthrough:
    """The ASGI endpoint for every relayed route."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        proxy = self.proxy
        started = time.perf_counter()
        headers = dict(scope["headers"])
        extra = scope_headers(scope)
        try:
            body = await read_body(receive, headers, proxy.settings.max_body_bytes)
        except ClientGone:
            return
        except GuardError as exc:
            await send_error(send, exc, extra, path=scope["path"])
            proxy.metrics.request_finished("passthrough", exc.status, time.perf_counter() - started)
            return
        target = wire_path(scope["path"])
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        status = 0
        head_sent = False

        async def work(watch: Watch) -> None:
            nonlocal status, head_sent
            client = proxy.client
            out = proxy.forward_headers(scope["headers"], scope.get(REQUEST_ID))
            if b"accept-encoding" not in headers:
                # Else httpx asks for its own (gzip, br, ...) and the engine's compressed
                # bytes would be relayed to a client that never asked for them.
                out.append((b"accept-encoding", b"identity"))
            req = client.build_request(scope["method"], target, headers=out, content=body)
            try:
                resp = await client.send(req, stream=True)
            except httpx.HTTPError as exc:
                upstream_failed(proxy.metrics, upstream.error_kind(exc))
                err = upstream.translate(exc)
                status = err.status
                head_sent = True
                await send_error(send, err, extra, path=scope["path"])
                return
            try:
                status = resp.status_code
                head = response_headers(resp.headers.raw, proxy.engine_url, keep_length=True)
                head_sent = True
                await send(
                    {"type": "http.response.start", "status": status, "headers": head + extra}
                )
                try:
                    async for data in resp.aiter_raw():
                        watch.seq += 1
                        await send({"type": "http.response.body", "body": data, "more_body": True})
                        watch.seq += 1
                except httpx.HTTPError as exc:
                    # Headers are out: the client must see a cut body, never a complete one.
                    upstream_failed(proxy.metrics, upstream.error_kind(exc))
                    watch.cancellable = False
                    await cut_response(send, proxy.bounds.write_timeout)
                    return
                await watch.send_last(send, {"type": "http.response.body", "body": b""})
            finally:
                watch.cancellable = False
                await resp.aclose()

        async def deadline() -> None:
            # The route's format is unknown here: a 504 if nothing went out, else a cut body.
            nonlocal status
            if not head_sent:
                status = 504
                await send_error(send, deadline_error(), extra, path=scope["path"])
            else:
                await cut_response(send, proxy.bounds.write_timeout)

        watch = await watched(receive, send, work, Watch(), proxy.bounds, deadline)
        proxy.metrics.request_finished(
            "passthrough", 499 if watch.gone else status, time.perf_counter() - started
        )
