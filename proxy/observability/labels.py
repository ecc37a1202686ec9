"""Bounded label values and cached labelled children: what keeps a hot metric call cheap and the
series count finite.

prometheus-client's ``labels()`` validates its arguments and takes a lock on every call;
:class:`Children` looks each child up once and keeps it in a plain dict, so a hot call is one
dict lookup plus an ``inc``/``observe``. Label values come from small fixed sets
(:func:`fixed`) or pass through :class:`CappedLabel`, so a client sending random model names
cannot blow up the series count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final, Generic, TypeVar

from prometheus_client.metrics import MetricWrapperBase

OTHER: Final = "other"


_LABEL_VALUE = re.compile(r"[A-Za-z0-9/][A-Za-z0-9_.:/@+\-]{0,127}")


M = TypeVar("M", bound=MetricWrapperBase)


class CappedLabel:
    """Maps free-form values to a bounded label set: first ``cap`` distinct values, then ``other``.

    ``initial`` values (configured models, say) are admitted up front and count toward the cap.
    Values that do not look like identifiers (spaces, control characters, > 128 chars) are
    ``other`` straight away: they are almost always junk sent by a client.

    Once :meth:`restrict` names the values that may exist (the models the engine lists), only
    those get a label of their own, so junk cannot take the cap's places before real values
    arrive; values already admitted that are not in it become ``other`` from then on (their
    existing series stay, frozen).
    """

    __slots__ = ("_allowed", "_cap", "_seen")

    def __init__(self, cap: int, initial: Iterable[str] = ()) -> None:
        self._cap = cap
        self._seen: set[str] = set()
        self._allowed: frozenset[str] | None = None
        for value in initial:
            self(value)

    def __call__(self, value: str | None) -> str:
        if value is None:
            return OTHER
        if value in self._seen:
            return value
        if len(self._seen) >= self._cap or not _LABEL_VALUE.fullmatch(value):
            return OTHER
        if self._allowed is not None and value not in self._allowed:
            return OTHER
        self._seen.add(value)
        return value

    def restrict(self, allowed: Iterable[str]) -> None:
        """From now on only ``allowed`` values get a label (still at most ``cap`` of them)."""
        self._allowed = frozenset(allowed)
        self._seen &= self._allowed

    @property
    def seen(self) -> frozenset[str]:
        return frozenset(self._seen)


class Children(Generic[M]):
    """A labelled metric with its children cached by label tuple (see module docstring)."""

    __slots__ = ("_cache", "_metric")

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._cache: dict[tuple[str, ...], M] = {}

    def __call__(self, *labels: str) -> M:
        child = self._cache.get(labels)
        if child is None:
            child = self._cache[labels] = self._metric.labels(*labels)
        return child


def fixed(value: str | None, allowed: frozenset[str]) -> str:
    if value is not None and value in allowed:
        return value
    return OTHER
