"""``coherence-guard serve``: run the proxy under uvicorn (uvloop + httptools).

Command-line flags win over ``GUARD_*`` variables. They are handed to the server as
environment variables, so every worker process (``--workers N``) builds the same settings
through the same validation.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.settings import Settings

_FLAGS = {
    "host": "GUARD_HOST",
    "port": "GUARD_PORT",
    "upstream": "GUARD_UPSTREAM_URL",
    "workers": "GUARD_WORKERS",
    "mode": "GUARD_MODE",
    "log_level": "GUARD_LOG_LEVEL",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="address to listen on (GUARD_HOST, default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="port to listen on (GUARD_PORT, default 8080)")
    parser.add_argument(
        "--upstream", metavar="URL", help="the engine, e.g. http://HOST:8000 (GUARD_UPSTREAM_URL)"
    )
    parser.add_argument("--workers", type=int, help="worker processes (GUARD_WORKERS, default 1)")
    parser.add_argument("--mode", choices=("enforce", "monitor", "off"), help="GUARD_MODE")
    parser.add_argument("--log-level", help="GUARD_LOG_LEVEL (default info)")


def run(args: argparse.Namespace) -> int:
    from proxy.settings import ConfigError, load_detector_config, load_settings

    for attr, var in _FLAGS.items():
        value = getattr(args, attr, None)
        if value is not None:
            os.environ[var] = str(value)
    try:
        settings = load_settings()
        load_detector_config()
    except ConfigError as exc:
        print(f"coherence-guard: {exc}", file=sys.stderr)
        return 2

    from proxy.metrics import MULTIPROC_ENV, prepare_multiprocess

    # Several workers share their counters through prometheus-client's multiprocess mode. A
    # directory the proxy made itself holds nothing worth keeping once the server is gone.
    own_dir = MULTIPROC_ENV not in os.environ
    metrics_dir = prepare_multiprocess(settings.workers)
    try:
        _serve(settings)
    finally:
        if own_dir and metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def _serve(settings: Settings) -> None:
    import uvicorn

    uvicorn.run(
        "proxy.app:create_app_from_env",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        loop="uvloop",
        http="httptools",
        log_level=settings.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=10,
    )
