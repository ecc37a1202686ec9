"""What to ask the engine for its count of a request's prompt, and how to read its answer.

Why: an answer the guard aborts ends with a ``usage`` the proxy writes, and that usage must carry
the engine's count of the prompt (billing reads it) or leave it out, never a count the proxy does
not know (0 is a count). Where the engine reports usage as it streams (vLLM with the proxy's
``continuous_usage_stats``, ``message_start`` on Messages) the count is known before the abort.
Where it reports usage only at the end (llama.cpp; vLLM's Responses route; any engine that
refused the usage stream options) it is not, so the shell asks the engine, within
``GUARD_PROMPT_COUNT_TIMEOUT``, and only then: a healthy stream never waits for it.

The two engines the project is tested on both serve ``POST /tokenize``, in two dialects:

* vLLM (``vllm/entrypoints/serve/tokenize/protocol.py``): ``{"model", "messages", ...}`` is
  rendered with the chat template, as its chat route renders the same fields (its defaults are
  the chat route's: ``add_generation_prompt`` true, ``add_special_tokens`` false), and
  ``{"model", "prompt"}`` is tokenized as completions tokenizes it; both answer
  ``{"count", "max_model_len", "tokens"}``.
* llama.cpp's server: ``{"content", "add_special"}`` answers ``{"tokens"}`` alone, and a body
  without ``content`` is answered ``{"tokens": []}``. Its chat template is applied by
  ``POST /apply-template`` (the chat body in, ``{"prompt"}`` out); its chat and completions
  routes tokenize their prompt with special tokens added (``add_special``).

So a chat ask is vLLM's body first; an answer in llama.cpp's shape (``tokens`` and no
``count``) asks for the template and then the tokens of what it rendered. A completions ask
carries both dialects' fields in one body. Responses and Messages requests are asked as the chat
messages the engine builds from them, where the chat route expresses them exactly
(:func:`proxy.core.surfaces.via_chat.request.chat_messages`); anything it would not (tools,
images, documents) is not asked at all.

Pure: bodies in, counts out; the I/O is :mod:`proxy.server.prompt_count`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proxy.core.surfaces.via_chat.request import chat_messages

if TYPE_CHECKING:
    from proxy.core.records import Endpoint

#: Chat request fields that change the prompt the engine renders, all of which vLLM's tokenize
#: route takes as its chat route does (and llama.cpp's ``/apply-template`` as its chat route).
TEMPLATE_FIELDS = (
    "tools",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "mm_processor_kwargs",
    "media_io_kwargs",
)
#: Chat fields that change the prompt but that the tokenize route does not take: a count asked
#: without them would not be the engine's.
_UNCOUNTABLE = frozenset({"documents"})


@dataclass(frozen=True, slots=True)
class CountAsk:
    """One ask: the ``/tokenize`` body in vLLM's dialect; ``chat``: the engine renders a chat
    template first (llama.cpp: ``/apply-template`` with the same body, see :func:`text_body`)."""

    body: dict[str, Any]
    chat: bool


def prompt_count_ask(endpoint: Endpoint, body: Any) -> CountAsk | int | None:
    """What to ask for the prompt of ``body`` (the request the engine received); an ``int``
    when the request holds the count itself (a completions prompt of token ids); ``None`` when
    no ask gives the engine's own count."""
    if not isinstance(body, dict):
        return None
    model = body.get("model")
    head: dict[str, Any] = {"model": model} if isinstance(model, str) else {}
    if endpoint == "completions":
        return _completions_ask(head, body.get("prompt"), body.get("add_special_tokens"))
    if endpoint == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or _UNCOUNTABLE.intersection(body):
            return None
        fields = {k: body[k] for k in TEMPLATE_FIELDS if body.get(k) is not None}
        return CountAsk({**head, "messages": messages, **fields}, chat=True)
    converted = chat_messages(endpoint, body)
    if isinstance(converted, str):
        return None
    return CountAsk({**head, "messages": converted}, chat=True)


def _completions_ask(head: dict[str, Any], prompt: Any, special: Any) -> CountAsk | int | None:
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]  # one prompt in a list: the same request
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return len(prompt)  # token ids: the engine counts them as they are
    if not isinstance(prompt, str) or not prompt:
        return None  # several prompts (one count each), or nothing to count
    body = {**head, "prompt": prompt, **text_body(prompt)}
    if isinstance(special, bool):
        body["add_special_tokens"] = special  # vLLM's completions take it; llama.cpp's do not
    return CountAsk(body, chat=False)


def text_body(prompt: str) -> dict[str, Any]:
    """llama.cpp's ``/tokenize`` body for a rendered prompt, tokenized as its generating routes
    tokenize theirs (special tokens added and parsed)."""
    return {"content": prompt, "add_special": True, "parse_special": True}


def read_count(answer: Any) -> int | None:
    """The count in a ``/tokenize`` answer: vLLM's ``count``, else the length of llama.cpp's
    ``tokens``; ``None`` for anything else, and for no tokens at all (what llama.cpp answers a
    body it did not understand, never a prompt's count)."""
    if not isinstance(answer, dict):
        return None
    count = answer.get("count")
    if type(count) is int:
        return count if count > 0 else None
    tokens = answer.get("tokens")
    if "count" not in answer and isinstance(tokens, list) and tokens:
        return len(tokens)
    return None


def renders_apart(answer: Any) -> bool:
    """A ``/tokenize`` answer in llama.cpp's shape (``tokens`` without ``count``): that engine
    renders a chat template only through ``/apply-template``."""
    return (
        isinstance(answer, dict)
        and "count" not in answer
        and isinstance(answer.get("tokens"), list)
    )


def rendered_prompt(answer: Any) -> str | None:
    """The prompt of an ``/apply-template`` answer."""
    prompt = answer.get("prompt") if isinstance(answer, dict) else None
    return prompt if isinstance(prompt, str) and prompt else None
