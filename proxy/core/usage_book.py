"""What the engine counted of one request, as the relay keeps it: the last ``usage`` it
reported (a plain text chunk's read only when asked), the prompt's count, and the ending of an
aborted stream held until the shell has asked the engine for that count.

A part of :class:`proxy.core.guard.StreamGuard` of its own, so that the state machine's module
holds the relay and this one the accounting. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from proxy.core import chunks

if TYPE_CHECKING:
    from proxy.core.policy import GuardPolicy


class UsageBook:
    """The usage side of :class:`proxy.core.guard.StreamGuard` (which sets every attribute)."""

    policy: GuardPolicy
    aborted: bool
    _fast_usage: re.Match[bytes] | None
    _last_usage: dict[str, Any] | None
    _last_prompt_tokens: int | None
    #: The ending of an aborted stream, held until the shell has asked the engine for the
    #: prompt's count (see :meth:`ending`); written by :meth:`release`.
    held: Callable[[], bytes] | None

    @property
    def usage(self) -> dict[str, Any] | None:
        """The last ``usage`` the engine reported; a plain text chunk's is read only when asked
        (per chunk, only its completion count is: ``_fast_usage``)."""
        if self._fast_usage is not None:
            self._take_fast_usage()
        return self._last_usage

    @usage.setter
    def usage(self, value: dict[str, Any] | None) -> None:
        if self._fast_usage is not None:
            self._take_fast_usage()
        self._last_usage = value

    @property
    def prompt_tokens(self) -> int | None:
        if self._fast_usage is not None:
            self._take_fast_usage()
        return self._last_prompt_tokens

    @prompt_tokens.setter
    def prompt_tokens(self, value: int | None) -> None:
        if self._fast_usage is not None:
            self._take_fast_usage()
        self._last_prompt_tokens = value

    def _take_fast_usage(self) -> None:
        m = self._fast_usage
        assert m is not None
        self._fast_usage = None
        usage = self._last_usage = chunks.match_usage(m)
        self._last_prompt_tokens = usage["prompt_tokens"]

    def _note_usage(self, usage: dict[str, Any]) -> None:
        self.usage = usage
        pt = usage.get("prompt_tokens")
        if isinstance(pt, int):
            self.prompt_tokens = pt

    def ending(self, make: Callable[[], bytes]) -> bytes:
        """The events that end an aborted stream (their usage included), from ``make``: built
        and returned now, or, where the policy holds endings and the engine has not counted the
        prompt yet (it writes usage only at the end), held for :meth:`release`: the shell asks
        the engine for the count first. ``make`` runs when the ending is written, so it reads
        the count the shell found."""
        if self.policy.hold_ending and self.prompt_uncounted:
            self.held = make
            return b""
        return make()

    @property
    def prompt_uncounted(self) -> bool:
        """An aborted answer whose usage lacks the engine's count of the prompt: the shell asks
        the engine for it (:mod:`proxy.server.prompt_count`) before the answer ends."""
        return self.aborted and self.prompt_tokens is None

    def counted(self, prompt_tokens: int) -> None:
        """The engine's count of the prompt, asked for after the abort."""
        self.prompt_tokens = prompt_tokens

    def release(self) -> bytes:
        """The held ending (see :meth:`ending`), built now; empty when none is held."""
        make, self.held = self.held, None
        return b"" if make is None else make()
