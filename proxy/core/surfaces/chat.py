"""Chat and completions as a surface: the guard's own event handler, the hot path.

The Responses and Messages surfaces keep per-surface state and rewrite events; chat and
completions are relayed by :meth:`proxy.core.guard.StreamGuard._event` itself, and their
non-streamed answers rebuilt by :func:`proxy.core.reassemble.chat_response`. Most events of a
healthy stream are plain text chunks, which :meth:`ChatSurface.quick` relays from their bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from proxy.core import chunks
from proxy.core.reassemble import chat_response
from proxy.core.sse import DONE_EVENT, encode_data

if TYPE_CHECKING:
    from proxy.core.relay_types import GuardView
    from proxy.errors import GuardError


class ChatSurface:
    """Chat and completions: the event handler is :meth:`StreamGuard._event` itself."""

    def event(self, guard: GuardView, raw: bytes, data: bytes | None) -> bytes:
        return guard._event(raw, data)

    def quick(self, guard: GuardView, read: bytes, pos: int) -> tuple[bytes, int] | None:
        """:meth:`StreamGuard._event` for a whole plain text chunk at ``pos`` of ``read`` (see
        :func:`proxy.core.chunks.text_chunk`), without parsing its JSON; the same state changes
        and the same client bytes, and where the event ends. ``None`` before touching any state
        when the general path must decide (not such a chunk; the first chunk, which becomes the
        template; a new or ended choice)."""
        m = chunks.text_event(read, pos)
        if m is None or guard.template is None:
            return None
        state = guard.choices.get(int(m[1]))
        if state is None or state.ended:
            return None
        text = chunks.match_text(m)
        if text is None:
            return None
        end = m.end()
        count = m[7]
        if count is not None:
            guard._fast_usage = m
            ct = int(count)
            tokens = ct - state.tokens if ct >= state.tokens else 1
        else:
            tokens = 1 if text else 0
        state.tokens += tokens
        if text:
            guard.first_content = True
            verdict = state.detector.feed(text, tokens=tokens, logprobs=None)
            state.chars += len(text)
            if verdict is not None and state.verdict is None:
                if state.side is not None:
                    verdict = state.side.place(verdict, "content")
                chunk = orjson.loads(read[pos + 6 : end - 2])
                choice = chunk["choices"][0]
                if guard._on_verdict(state, choice, verdict, text):
                    if guard.policy.strip_chunk_usage:
                        if guard.policy.usage_null:
                            chunk["usage"] = None
                        else:
                            chunk.pop("usage", None)
                    return guard._maybe_finish(encode_data(orjson.dumps(chunk))), end
        if count is not None and guard.policy.strip_chunk_usage:
            cut = m.start(4)
            out = read[pos:cut] + (b',"usage":null}\n\n' if guard.policy.usage_null else b"}\n\n")
            return guard._maybe_finish(out), end
        out = read if pos == 0 and end == len(read) else read[pos:end]
        return (out if not guard.aborted else guard._maybe_finish(out)), end

    def failure(self, guard: GuardView, error: GuardError) -> bytes:
        return encode_data(error.to_json()) + DONE_EVENT

    def response(self, guard: GuardView, trim: bool) -> dict[str, Any]:
        return chat_response(guard, trim=trim)


CHAT = ChatSurface()
