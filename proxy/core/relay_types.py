"""The relay's shapes as the surfaces see them: the guard's state and the per-surface part.

:class:`proxy.core.guard.StreamGuard` runs a :class:`Surface` on every event, and the surfaces
(:mod:`proxy.core.surfaces`) and the rebuilt answers (:mod:`proxy.core.reassemble`) read and
write the guard's state. They name it by this protocol, not by the class, so they import
nothing from the guard: the guard stays above them, and no import (not even a type-only one)
runs back up. Only types live here; nothing runs at import.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from proxy.core.channels import BlockState, Channel
    from proxy.core.policy import GuardPolicy
    from proxy.detect import Verdict
    from proxy.errors import GuardError


class GuardView(Protocol):
    """What a surface uses of one request's relay state (:class:`StreamGuard` has it all)."""

    policy: GuardPolicy
    n: int
    choices: dict[int, BlockState]
    done: bool
    saw_done: bool
    aborted: bool
    error: dict[str, Any] | None
    prompt_tokens: int | None
    usage: dict[str, Any] | None
    template: dict[str, Any] | None
    #: The surface's own state (its module's ``*State``), made on its first event.
    extra: Any
    #: Chat's byte-level path: a content was seen, and the last chunk's usage (read lazily).
    first_content: bool
    _fast_usage: re.Match[bytes] | None

    def new_block(self, index: int) -> BlockState: ...

    def feed_text(
        self, state: BlockState, text: str, channel: Channel = "content"
    ) -> Verdict | None: ...

    def final_usage(self) -> dict[str, Any]: ...

    def judge_finish(self, state: BlockState) -> Verdict | None: ...

    def ending(self, make: Callable[[], bytes]) -> bytes: ...

    def _event(self, raw: bytes, data: bytes | None) -> bytes: ...

    def _on_verdict(
        self, state: BlockState, choice: dict[str, Any], verdict: Verdict, text: str
    ) -> bool: ...

    def _maybe_finish(self, out: bytes) -> bytes: ...


class Surface(Protocol):
    """The per-surface part of the relay (see :mod:`proxy.core.guard`)."""

    def event(self, guard: GuardView, raw: bytes, data: bytes | None) -> bytes:
        """Client bytes for one upstream event."""

    def failure(self, guard: GuardView, error: GuardError) -> bytes:
        """The events that end a client stream whose upstream failed."""

    def response(self, guard: GuardView, trim: bool) -> dict[str, Any]:
        """The non-streamed answer rebuilt from what the guard saw."""
