"""The modules ``compiled_work.sh`` (beside this folder) compiles with mypyc, and whether the
running ones are.

The per-event path (SSE parsing, the relay's state machine and surfaces) and the detector, minus
its fastText wrapper (``proxy.detect.language``: C++ already, and tests replace its functions);
``proxy.core.heal`` and its helpers because ``HealGuard`` extends ``StreamGuard`` (a compiled
class is extended by compiled classes only, unless it says otherwise).
"""

from __future__ import annotations

import importlib
from importlib.machinery import EXTENSION_SUFFIXES

MODULES: tuple[str, ...] = (
    "proxy.core.channels",
    "proxy.core.chunks",
    "proxy.core.guard",
    "proxy.core.heal",
    "proxy.core.heal_cut",
    "proxy.core.heal_request",
    "proxy.core.policy",
    "proxy.core.reassemble",
    "proxy.core.records",
    "proxy.core.relay_types",
    "proxy.core.sse",
    "proxy.core.surfaces.chat",
    "proxy.core.surfaces.messages",
    "proxy.core.surfaces.responses",
    "proxy.detect.blocks",
    "proxy.detect.detector",
    "proxy.detect.diversity",
    "proxy.detect.drift",
    "proxy.detect.ending",
    "proxy.detect.entropy",
    "proxy.detect.gibberish",
    "proxy.detect.lines",
    "proxy.detect.repetition",
    "proxy.detect.salad",
    "proxy.detect.script",
    "proxy.detect.types",
)


def compiled_count() -> int:
    """How many of :data:`MODULES` run from a C extension (imported now if they were not)."""
    suffixes = tuple(EXTENSION_SUFFIXES)
    return sum(
        (getattr(importlib.import_module(m), "__file__", None) or "").endswith(suffixes)
        for m in MODULES
    )
