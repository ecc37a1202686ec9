"""The detector's data, loaded beside serving.

Why: the data the detector and the request rewriting read — the language model, the
language-name index, the 26 word-frequency lists that place a short prompt's language and the
salad signal's word lists — take seconds of CPU to load (about 5 s on a shared two-core machine:
docs/performance.md, "Start-up"). Loaded in the application's start-up they kept a restarted or
scaled-out worker deaf that long; loaded inside the first request that needs them, they would
stall every stream of the worker (they are CPU work under the GIL).

So they load in a background thread, one step after the other, while the server already
answers. A guarded request that arrives before a step it needs has finished *waits for that
step* — asynchronously, so every other request goes on — which is at most the rest of a load
already under way, never a load of its own. It is then judged with the very same data a later
request gets (the loaders are the pure core's own, cached per process), so no verdict depends
on when a request arrived. What a request waits for:

* before its rewrite (the expected language is derived there): the language model, the name
  index and the word-frequency lists (:data:`REWRITE`);
* before its answer is judged: the salad word list of its expected language; in heal mode every
  list loaded here, as a continuation is held to the language of the answer it continues and its
  vocabulary is judged in that language; nothing in mode ``off``.

A step that fails is logged and counts as done: the request's own call then loads (or fails) as
it would have without a preload.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Sequence

from proxy.detect import Detector, DetectorConfig
from proxy.settings import Settings

log = logging.getLogger("coherence_guard")

#: The language model (and the rest of the detector's lazy parts).
MODEL = "language-model"
#: The language-name index (``x-guard-language``, the derivation's "answer in X").
NAMES = "language-names"
#: The word-frequency lists that place a short prompt's language.
FREQUENCIES = "word-frequencies"
#: What a request's rewrite may read.
REWRITE = (MODEL, NAMES, FREQUENCIES)
_SALAD = "salad:"

Step = tuple[str, Callable[[], object]]


def salad_key(language: str) -> str:
    """The step that loads the salad word list of ``language``."""
    return _SALAD + language


class Preload:
    """Runs named loading steps in order in one background thread; requests await the names
    they need (:meth:`wait`). Start it on the event loop (:meth:`start`), close it at shutdown
    (:meth:`aclose`)."""

    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps = list(steps)
        self._done: dict[str, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None
        #: Requests waiting for a step right now.
        self.waiting = 0
        #: Every step has run (the one check a request makes from then on).
        self.done = not self.steps
        #: Every salad step (heal mode waits for them all).
        self.salad_keys = frozenset(key for key, _ in self.steps if key.startswith(_SALAD))

    def start(self) -> None:
        """Begin loading; returns at once."""
        self._done = {key: asyncio.Event() for key, _ in self.steps}
        if self.steps:
            self._task = asyncio.create_task(self._run(), name="coherence-guard-preload")

    async def _run(self) -> None:
        started = time.perf_counter()
        try:
            for key, step in self.steps:
                try:
                    await asyncio.to_thread(step)
                except Exception:
                    log.exception("could not load %s ahead of requests", key)
                self._done[key].set()
        finally:
            # Also when cancelled at shutdown: nobody stays waiting.
            for event in self._done.values():
                event.set()
            self.done = True
        log.info(
            "detector data loaded beside serving in %.1f s (%s)",
            time.perf_counter() - started,
            ", ".join(key for key, _ in self.steps),
        )

    async def wait(self, keys: Iterable[str]) -> None:
        """Return once every step of ``keys`` this preload runs is done (at once when they
        are, as for every request after the first seconds)."""
        if self.done:
            return
        pending = [event for key in keys if (event := self._done.get(key)) and not event.is_set()]
        if not pending:
            return
        self.waiting += 1
        try:
            for event in pending:
                await event.wait()
        finally:
            self.waiting -= 1

    async def aclose(self) -> None:
        """Stop after the step under way (a thread cannot be interrupted)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


_WARM_UP_TEXT = (
    "The proxy reads a few sentences at start-up so that every lazily loaded part of the "
    "detector is ready before the first request arrives. Nothing here is sent anywhere. "
) * 4


def _language_model(config: DetectorConfig) -> None:
    """The language model (~0.1 s), and the detector's other lazy parts on a few sentences."""
    from proxy.detect.language import identify_language

    identify_language(_WARM_UP_TEXT)
    # Salad off here: its word lists are steps of their own.
    detector = Detector(dataclasses.replace(config, salad=False), expected_language="en")
    for word in _WARM_UP_TEXT.split(" "):
        detector.feed(word + " ")
    detector.finish()


def _names() -> None:
    """The language-name index and its pattern for unspaced scripts (~50 ms, ~3 MB)."""
    from proxy.core.language_mentions import find_names

    find_names("用英文回答")


def _frequencies() -> None:
    """The 26 word-frequency lists (~0.8 s, ~10 MB in all)."""
    from proxy.detect.word_language import load_all

    load_all()


def _salad(language: str) -> Callable[[], object]:
    def load() -> object:
        from proxy.detect import salad

        return salad.lexicon(language)

    return load


def salad_languages(settings: Settings) -> frozenset[str]:
    """The word lists a request may need: the configured language's, or every supported one
    when the language comes from the prompt."""
    from proxy.detect.salad import SALAD_LANGUAGES

    if settings.language in SALAD_LANGUAGES:
        return frozenset({settings.language})
    if settings.language == "auto" or settings.expect_language == "prompt":
        return SALAD_LANGUAGES
    return frozenset()


def preload_steps(settings: Settings, config: DetectorConfig) -> list[Step]:
    """What this worker loads ahead of requests, in order: what every request's rewrite and
    detector read first, then the salad lists. Nothing in mode ``off`` (a request that asks for
    another mode loads what it needs itself)."""
    if settings.mode == "off":
        return []
    steps: list[Step] = [(MODEL, lambda: _language_model(config)), (NAMES, _names)]
    if settings.language == "auto" or settings.expect_language == "prompt":
        steps.append((FREQUENCIES, _frequencies))
    if config.salad:
        steps += [(salad_key(lang), _salad(lang)) for lang in sorted(salad_languages(settings))]
    return steps
