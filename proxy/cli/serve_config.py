"""``coherence-guard config``: print the effective configuration, secrets masked.

What the proxy would run with, after defaults, ``.env`` and the environment are merged and
validated: the quickest answer to "why does it behave like this". ``--explain`` adds what each
variable does (from :mod:`proxy.cli.explain`, the source ``.env.example`` is generated from). An
invalid value exits with status 2 and one line naming the variable; ``GUARD_*`` variables the
proxy does not read (typos) are named on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import textwrap
from typing import Any

MASK = "***"


def mask_url(url: str) -> str:
    """``url`` with its password masked (see :func:`proxy.settings.mask_url`)."""
    from proxy.settings import mask_url as mask

    return mask(url)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of VAR=value lines")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print each variable's current value, its default and what it does",
    )


def _masked(name: str, value: Any) -> Any:
    from proxy.settings import SECRET_FIELDS

    if name in SECRET_FIELDS and value:
        return [MASK] * len(value) if isinstance(value, list) else MASK
    if name == "upstream_url":
        return mask_url(value)
    return value


def effective_config() -> dict[str, Any]:
    """``GUARD_*`` name → value (secrets masked). Raises ConfigError."""
    from proxy.settings import load_detector_config, load_settings

    settings = load_settings()
    detector = load_detector_config()
    values: dict[str, Any] = {}
    for name, value in settings.model_dump().items():
        values["GUARD_" + name.upper()] = _masked(name, value)
    for f in dataclasses.fields(detector):
        values["GUARD_" + f.name.upper()] = getattr(detector, f.name)
    return values


def _defaults() -> dict[str, Any]:
    from proxy.detect import DetectorConfig
    from proxy.settings import Settings

    out = {
        "GUARD_" + name.upper(): info.get_default(call_default_factory=True)
        for name, info in Settings.model_fields.items()
    }
    for f in dataclasses.fields(DetectorConfig):
        out["GUARD_" + f.name.upper()] = f.default
    return out


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value, default=str)


def _explain(values: dict[str, Any]) -> str:
    from proxy.cli.explain import meanings

    meaning = meanings()
    defaults = _defaults()
    lines = []
    for name, value in values.items():
        shown = _text(value)
        default = _text(defaults.get(name))
        changed = "" if shown == default else f"   (default {default})"
        lines.append(f"{name}={shown}{changed}")
        lines += textwrap.wrap(
            meaning.get(name, "(no description)"),
            width=96,
            initial_indent="    ",
            subsequent_indent="    ",
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from proxy.settings import ConfigError, unknown_variables

    try:
        values = effective_config()
    except ConfigError as exc:
        print(f"coherence-guard: {exc}", file=sys.stderr)
        return 2
    for warning in unknown_variables():
        print(f"coherence-guard: warning: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps(values, indent=2, sort_keys=True, default=str))
    elif args.explain:
        print(_explain(values))
    else:
        for name, value in values.items():
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            print(f"{name}={text}")
    return 0
