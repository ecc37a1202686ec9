"""``coherence-guard`` command line: serve | config | score | check | demo | calibrate | explain.

Each sub-command lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int`` (exit status); this file only wires them. Sub-command modules keep their
top level cheap (heavy imports inside ``run``) so ``coherence-guard score`` does not pay for
FastAPI and ``serve`` does not pay for the scorer.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

_COMMANDS = {
    "serve": ("proxy.cli.serve", "run the proxy"),
    "config": (
        "proxy.cli.serve_config",
        "print the effective configuration, secrets masked (--explain: what each variable does)",
    ),
    "score": ("proxy.cli.score", "run the detector offline over a JSONL file of texts"),
    "check": ("proxy.cli.check", "three-tier coherence check of a deployment"),
    "demo": ("proxy.cli.demo", "a real model loops on a laptop, with and without the guard"),
    "calibrate": ("proxy.cli.calibrate.run", "measure where a model degenerates; recommend caps"),
    "explain": (
        "proxy.cli.why",
        "why the detector judged one text as it did: signal, evidence, onset, settings",
    ),
}


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="coherence-guard",
        description="Coherence Guard: a streaming proxy in front of vLLM (or any "
        "OpenAI-compatible engine) that stops degenerate generations at the engine.",
        epilog="coherence-guard COMMAND --help explains each command.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in _COMMANDS.items():
        sp = sub.add_parser(name, help=help_text)
        sp.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(sp)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    code: int = importlib.import_module(args._module).run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
