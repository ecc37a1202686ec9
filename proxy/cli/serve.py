"""``coherence-guard serve``: run the proxy under uvicorn (uvloop + httptools).

Command-line flags win over ``GUARD_*`` variables. They are handed to the server as
environment variables, so every worker process (``--workers N``) builds the same settings
through the same validation.

Start-up happens in this order, all in the parent process before uvicorn starts a worker: the
configuration is validated (a bad value exits with status 2 and one line naming it), logging is
configured (the same dictionary is uvicorn's ``log_config``, so every worker logs the same way),
and a report says which engine is used (and whether that is the default), whether it answers
and which models it serves. An engine that does not answer does not stop the proxy: it starts,
answers 502, and each worker's engine monitor (:func:`proxy.server.engine_watch.watch_engine`) keeps
saying so until the engine answers.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import os
import shutil
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.settings import Settings

log = logging.getLogger("proxy.cli.serve")

_FLAGS = {
    "host": "GUARD_HOST",
    "port": "GUARD_PORT",
    "upstream": "GUARD_UPSTREAM_URL",
    "workers": "GUARD_WORKERS",
    "mode": "GUARD_MODE",
    "log_level": "GUARD_LOG_LEVEL",
}

DESCRIPTION = """\
Run the proxy: clients talk to it instead of the engine (http://HOST:PORT/v1), and every
answer of /v1/chat/completions, /v1/completions, /v1/responses and /v1/messages passes
through the degeneration detector; the engine's other routes are relayed as they are.
"""

EPILOG = """\
modes (--mode, GUARD_MODE):
  enforce   abort a degenerate generation at the engine (the engine frees its slot) and end
            the client's stream with finish_reason GUARD_ABORT_FINISH_REASON (default)
  monitor   detect and count in /metrics/quality, never change a byte the client gets
  off       relay the engine's answer as it is (request rewriting still applies)
  heal      cut a degenerate generation back to where the loop began and let the engine
            continue the same answer from there (GUARD_HEAL_*)

Every flag has a GUARD_* variable (flags win); all other settings are GUARD_* variables or
lines in ./.env. See what each one does and its current value with
  coherence-guard config --explain
Without --upstream or GUARD_UPSTREAM_URL the engine is http://127.0.0.1:8000.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--host", help="address to listen on (GUARD_HOST, default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="port to listen on (GUARD_PORT, default 8080)")
    parser.add_argument(
        "--upstream",
        metavar="URL",
        help="the engine, e.g. http://HOST:8000 (GUARD_UPSTREAM_URL, default "
        "http://127.0.0.1:8000)",
    )
    parser.add_argument("--workers", type=int, help="worker processes (GUARD_WORKERS, default 1)")
    parser.add_argument(
        "--mode",
        choices=("enforce", "monitor", "off", "heal"),
        help="what to do with a degenerate generation (GUARD_MODE, default enforce; see below)",
    )
    parser.add_argument(
        "--log-level",
        metavar="LEVEL",
        help="debug, info, warning, error or critical (GUARD_LOG_LEVEL, default info)",
    )


def _flag_note(problem: str, given: dict[str, str]) -> str:
    for var, flag in given.items():
        if problem.startswith(var + "=") or problem.startswith(var + ":"):
            return f"{problem} (from {flag})"
    return problem


def run(args: argparse.Namespace) -> int:
    from proxy.settings import ConfigError, load_detector_config, load_settings, unknown_variables

    given: dict[str, str] = {}
    for attr, var in _FLAGS.items():
        value = getattr(args, attr, None)
        if value is not None:
            os.environ[var] = str(value)
            given[var] = "--" + attr.replace("_", "-")
    try:
        settings = load_settings()
        load_detector_config()
    except ConfigError as exc:
        problems = "; ".join(_flag_note(p, given) for p in exc.problems)
        print(f"coherence-guard: invalid configuration: {problems}", file=sys.stderr)
        return 2

    from proxy.observability.logs import configure_logging

    configure_logging(settings)
    for warning in unknown_variables():
        log.warning("%s", warning)
    report_startup(settings, upstream_given="GUARD_UPSTREAM_URL" in os.environ)

    from proxy.observability.multiprocess import MULTIPROC_ENV, prepare_multiprocess

    # Several workers share their counters through prometheus-client's multiprocess mode; an
    # operator's PROMETHEUS_MULTIPROC_DIR puts even one worker in it, so what a previous process
    # left there is cleared first, whatever the number of workers. A directory the proxy made
    # itself holds nothing worth keeping once the server is gone.
    own_dir = MULTIPROC_ENV not in os.environ
    metrics_dir = prepare_multiprocess(settings.workers)
    try:
        _serve(settings)
    finally:
        if own_dir and metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def _upstream_given_in_dotenv() -> bool:
    with contextlib.suppress(OSError), open(".env", encoding="utf-8") as fh:
        return any(line.strip().startswith("GUARD_UPSTREAM_URL=") for line in fh)
    return False


def loopback(host: str) -> bool:
    """Whether ``host`` is an address only this host can reach (``127.0.0.0/8``, ``::1``,
    ``localhost``)."""
    name = host.strip().strip("[]").lower().rstrip(".")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def open_door(settings: Settings) -> str | None:
    """The one start-up warning for a port that checks no client key (``GUARD_API_KEYS``
    unset) on an address other hosts can reach; ``None`` when there is nothing to say.

    Why a warning and not a refusal to start: the default ``0.0.0.0`` is what a container needs
    (its loopback is its own), and a proxy behind a gateway or inside a cluster network that
    authenticates clients itself needs no keys of its own. But the one-liner that opens an
    unauthenticated port in front of a GPU must say so, once, naming the variable that closes
    it. Holding the engine's key (``GUARD_UPSTREAM_API_KEY``) makes it worse: anyone's request
    then carries the operator's credential, and the line says that instead."""
    if settings.api_keys or loopback(settings.host):
        return None
    if settings.upstream_api_key:
        return (
            f"GUARD_UPSTREAM_API_KEY is set and GUARD_API_KEYS is not, on {settings.host}: "
            "anyone who reaches this port uses the engine with the proxy's key. Set "
            "GUARD_API_KEYS, or listen on 127.0.0.1"
        )
    return (
        f"GUARD_API_KEYS is not set, on {settings.host}: anyone who reaches this port uses the "
        "engine, unauthenticated. Set GUARD_API_KEYS to require client keys, or listen on "
        "127.0.0.1"
    )


def report_startup(settings: Settings, *, upstream_given: bool) -> None:
    """Log what the proxy will use: engine (default or not), whether it answers, its models."""
    import httpx

    from proxy.cli.serve_config import mask_url
    from proxy.server.engine_watch import describe_models, probe_engine_sync, upstream_headers

    url = mask_url(settings.upstream_url)
    door = open_door(settings)
    if door is not None:
        log.warning("%s", door)
    given = upstream_given or _upstream_given_in_dotenv()
    source = "" if given else " (the default: neither --upstream nor GUARD_UPSTREAM_URL is set)"
    log.info(
        "coherence-guard on %s:%d, %d worker(s), mode=%s; engine %s%s",
        settings.host,
        settings.port,
        settings.workers,
        settings.mode,
        url,
        source,
    )
    headers = upstream_headers(settings)
    with httpx.Client(verify=_probe_verify(settings), trust_env=False) as client:
        status = probe_engine_sync(client, settings.upstream_url, headers)
        unguarded = (
            served_unguarded(client, settings.upstream_url, headers)
            if status.answers and settings.unguarded_routes == "pass"
            else []
        )
    if status.answers:
        log.info(
            "engine at %s answers (%s; %s)", url, status.detail, describe_models(status.models)
        )
        if unguarded:
            log.warning(
                "this engine serves routes that generate text unguarded (relayed as they are; "
                "GUARD_UNGUARDED_ROUTES=reject refuses them): %s",
                ", ".join(unguarded),
            )
    else:
        log.warning(
            "engine at %s does not answer: %s; starting anyway: guarded requests get 502 until "
            "it does%s",
            url,
            status.detail,
            "" if given else " (give the engine with --upstream URL)",
        )


def served_unguarded(client: Any, upstream_url: str, headers: Any) -> list[str]:
    """The engine routes that generate text without the guard (see
    :data:`proxy.server.paths.UNGUARDED_GENERATING`) that this engine lists in its ``/openapi.json``
    (vLLM's FastAPI app does). Why: a warning about routes the engine does not have is noise
    that hides the one that matters. An engine without the document gets no warning."""
    import httpx

    from proxy.server.engine_watch import CHECK_TIMEOUT
    from proxy.server.paths import UNGUARDED_GENERATING

    try:
        resp = client.get(
            upstream_url.rstrip("/") + "/openapi.json", headers=headers, timeout=CHECK_TIMEOUT
        )
        paths = resp.json().get("paths") if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return []
    if not isinstance(paths, dict):
        return []
    return [path for path in UNGUARDED_GENERATING if path in paths]


def _probe_verify(settings: Settings) -> Any:
    """The TLS context the start-up probe uses: the proxy's own (one upstream configuration,
    :class:`proxy.server.upstream.UpstreamConfig`, for every client)."""
    from proxy.server.upstream import UpstreamConfig

    return UpstreamConfig.from_settings(settings).ssl


def create_served_app() -> Any:
    """The app factory uvicorn calls in each worker: :func:`proxy.server.app.create_app` plus the
    engine monitor as a background task of its lifespan (started after the app's own start-up,
    cancelled before its shutdown; it never delays start-up).

    Only public pieces are used (``create_app(settings, metrics=...)`` and Starlette's
    ``router.lifespan_context``), and the monitor has its own small client, so the app's
    internals can change freely. Logging is already configured: uvicorn applied
    :func:`proxy.observability.logs.logging_config` in this worker before calling the factory.
    """
    import asyncio

    from proxy.observability.metrics import Metrics
    from proxy.server.app import create_app
    from proxy.server.engine_watch import upstream_headers, watch_engine
    from proxy.server.upstream import UpstreamConfig
    from proxy.settings import load_settings

    settings = load_settings()
    metrics = Metrics.from_settings(settings)
    app = create_app(settings, metrics=metrics)
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        async with (
            inner(a) as state,
            UpstreamConfig.from_settings(settings).httpx_client() as client,
        ):
            monitor = asyncio.create_task(
                watch_engine(
                    client,
                    settings.upstream_url,
                    metrics,
                    settings.upstream_check_interval,
                    headers=upstream_headers(settings),
                    contexts=app.proxy.contexts,
                )
            )
            try:
                yield state
            finally:
                monitor.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await monitor

    app.router.lifespan_context = lifespan
    return app


#: Seconds an idle client connection stays open (uvicorn's default is 5). A server must not
#: close an idle connection before its clients stop reusing it: a request a client writes on
#: a connection the server is closing that same moment is lost (a reset, and the request never
#: reaches the proxy; a POST is not retried). Clients' pools expire idle connections first
#: when this is longer than theirs: httpx 5 s, aiohttp 15 s, nginx and most load balancers
#: 60 s; 75 s is nginx's own server-side default.
KEEPALIVE_TIMEOUT = 75


def _serve(settings: Settings) -> None:
    import uvicorn

    from proxy.observability.logs import logging_config

    uvicorn.run(
        "proxy.cli.serve:create_served_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        loop="uvloop",
        http="httptools",
        # Levels come from log_config alone: uvicorn's own log_level would also lower the
        # access log to GUARD_LOG_LEVEL, and an access log asked for must not vanish at warning.
        log_config=logging_config(settings),
        log_level=None,
        access_log=settings.access_log,
        timeout_graceful_shutdown=10,
        timeout_keep_alive=KEEPALIVE_TIMEOUT,
    )
