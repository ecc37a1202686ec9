"""The detectors of one guarded request: built from the request's rewrite and the proxy's
detector settings, the first one ahead of the first event (see :class:`DetectorMaker`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from proxy.core.rewrite import Rewrite
from proxy.detect import Detector
from proxy.server.state import Proxy

__all__ = ["DetectorMaker", "language_detector"]


class DetectorMaker:
    """Builds each block's detector for one request; the first one can be built ahead
    (:meth:`prepare`), while the engine works on the first token, so that building it (a few
    dozen µs) is not on the path of the first token to the client. Every detector it hands
    out is built from the same settings and holds no text yet: which one a block gets changes
    no verdict.

    A guard asks for the first detector when the engine's first output chunk opens the first
    block, so :attr:`on_first` (the request's trace, when traces are on) is told of that chunk
    here, once, and no chunk pays for it."""

    __slots__ = ("_config", "_rw", "_spare", "on_first")

    def __init__(self, proxy: Proxy, rw: Rewrite) -> None:
        self._config = proxy.detector_config
        self._rw = rw
        self._spare: Detector | None = None
        self.on_first: Callable[[], None] | None = None

    def serves(self, rw: Rewrite) -> bool:
        """Whether this maker was made for ``rw`` (a request rewritten again after an engine's
        refusal gets a maker of its own)."""
        return self._rw is rw

    def prepare(self) -> None:
        """Build the first block's detector now (an event-loop callback: a failure here is
        left for the block, which builds its own and fails where the request handles it)."""
        if self._spare is None:
            with contextlib.suppress(Exception):
                self._spare = self._build()

    def __call__(self) -> Detector:
        if self.on_first is not None:
            self.on_first()
            self.on_first = None
        spare, self._spare = self._spare, None
        return spare if spare is not None else self._build()

    def _build(self) -> Detector:
        rw = self._rw
        return Detector(
            self._config,
            expected_language=rw.expected_language,
            structured=rw.structured,
            language_source=rw.expectation.source,
            accepted_languages=rw.expectation.accepted,
            quoted_turns=rw.quotes_turns,
        )


def language_detector(proxy: Proxy, rw: Rewrite) -> Callable[[str], Detector] | None:
    """For heal: a continuation's detector held to the language of the answer it continues,
    when the request itself named none (a named language stays the expectation)."""
    if rw.expected_language is not None or proxy.settings.expect_language == "off":
        return None
    config = proxy.detector_config
    structured = rw.structured
    quoted = rw.quotes_turns

    def make(language: str) -> Detector:
        return Detector(
            config, expected_language=language, structured=structured, quoted_turns=quoted
        )

    return make
