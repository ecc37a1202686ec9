"""``coherence-guard config``: print the effective configuration, secrets masked.

What the proxy would run with, after defaults, ``.env`` and the environment are merged and
validated: the quickest answer to "why does it behave like this". An invalid value exits with
status 2 and a message naming the variable.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any
from urllib.parse import urlsplit, urlunsplit

MASK = "***"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of VAR=value lines")


def _mask_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{MASK}@{host}"))


def effective_config() -> dict[str, Any]:
    """``GUARD_*`` name → value (secrets masked). Raises ConfigError."""
    from proxy.settings import load_detector_config, load_settings

    settings = load_settings()
    detector = load_detector_config()
    values: dict[str, Any] = {}
    for name, value in settings.model_dump().items():
        if name == "api_keys":
            value = [MASK] * len(value)
        elif name == "upstream_url":
            value = _mask_url(value)
        values["GUARD_" + name.upper()] = value
    for f in dataclasses.fields(detector):
        values["GUARD_" + f.name.upper()] = getattr(detector, f.name)
    return values


def run(args: argparse.Namespace) -> int:
    from proxy.settings import ConfigError

    try:
        values = effective_config()
    except ConfigError as exc:
        print(f"coherence-guard: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(values, indent=2, sort_keys=True, default=str))
    else:
        for name, value in values.items():
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            print(f"{name}={text}")
    return 0
