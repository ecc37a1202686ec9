"""Request rewriting: pure functions over the client's request dict.

The proxy patches the client's JSON object rather than round-tripping it through a strict model:
engines accept many extra fields (vLLM's ``extra="allow"``), and a field we don't know about must
reach the engine exactly as the client sent it. Only the fields the guard relies on are
type-checked, so a wrong type there is a 400 naming the field instead of a confusing failure
later in the stream.

What is rewritten, and why:

* ``max_tokens`` — with no limit, vLLM lets a chat request run to the end of the context (128K
  tokens on Llama-3.1): one loop can hold a slot for half an hour. A missing limit gets a default
  and an excessive one is clamped (or rejected).
* a language instruction — models drift into English (or Chinese) on long answers; an explicit
  instruction in the user's own language measurably reduces that, and the detector is told
  which language to expect.
* per-model sampling defaults — operators know which model needs ``repetition_penalty``.
* ``stream`` + ``stream_options`` — the proxy always reads a stream, with usage in every chunk,
  so it can stop early and knows exact token counts even for non-streaming clients.

The Responses API (``/v1/responses``) and Anthropic Messages (``/v1/messages``) get the same
treatment in their own words: ``max_output_tokens`` (default and cap) and ``instructions`` for
Responses; only the cap on Messages, where ``max_tokens`` is required, and ``system`` (a string
or a list of blocks). Both are streamed upstream whatever the client asked (their streams carry
no per-chunk usage, so there are no stream options to add), and sampling defaults are applied
only for the fields each route passes to the engine (:data:`SURFACE_SAMPLING_FIELDS`).
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proxy.core.language_rule import (
    constrain_language,
    constrain_surface_language,
    request_turns,
)
from proxy.core.records import Endpoint
from proxy.core.requested_language import UNSET, Expectation, Role, derive
from proxy.detect.turns import quotes_turns
from proxy.errors import BadRequest

if TYPE_CHECKING:
    from proxy.settings import Settings


#: The documented default of OpenAI's and vLLM's ``/v1/completions``; made explicit because other
#: engines (llama.cpp's server) treat a missing limit as "until the context is full".
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

#: Sampling fields vLLM 0.32 reads on each of the newer routes; a default outside these would be
#: dropped by the engine (Messages forwards only four) or warned about, so it is not added.
SURFACE_SAMPLING_FIELDS: Mapping[str, frozenset[str]] = {
    "responses": frozenset(
        {
            "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
            "repetition_penalty", "seed", "stop", "stop_token_ids", "logit_bias",
        }
    ),
    "messages": frozenset({"temperature", "top_p", "top_k", "stop_sequences"}),
}  # fmt: skip
#: The token-limit field of each newer route.
SURFACE_LIMIT = {"responses": "max_output_tokens", "messages": "max_tokens"}


@dataclass(frozen=True, slots=True)
class RewritePolicy:
    """The rewriting rules, resolved once from settings."""

    max_tokens_default: int = 8192
    max_tokens_cap: int = 32768
    max_tokens_policy: str = "clamp"
    language: str = "off"
    #: Without an injected language, expect the one the prompt is written in (``prompt``) or none.
    expect_language: str = "prompt"
    sampling_defaults: Mapping[str, Mapping[str, Any]] | None = None
    request_usage: bool = True
    request_logprobs: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> RewritePolicy:
        return cls(
            max_tokens_default=settings.max_tokens_default,
            max_tokens_cap=settings.max_tokens_cap,
            max_tokens_policy=settings.max_tokens_policy,
            language=settings.language,
            expect_language=settings.expect_language,
            sampling_defaults=settings.sampling_defaults,
            request_usage=settings.request_usage,
            request_logprobs=settings.request_logprobs,
        )


@dataclass(slots=True)
class Rewrite:
    """The request to send upstream, and what the guard learned while rewriting it."""

    body: dict[str, Any]
    model: str | None
    client_stream: bool
    client_wants_usage: bool
    max_tokens: int
    max_tokens_action: str | None
    max_tokens_header: str
    expected_language: str | None
    injected_language: str | None
    structured: bool
    n: int
    #: The proxy asked for logprobs the client did not (GUARD_REQUEST_LOGPROBS): the relay
    #: feeds them to the detector and removes them from the client's answer.
    injected_logprobs: bool = False
    #: No limit was sent: the engine's own (the rest of its context, at most ``max_tokens``)
    #: is within the default. Follow-up requests (heal's continuations) send none either.
    engine_limited: bool = False
    #: Where the expected language came from, and why (``x-guard-language``, metrics).
    expectation: Expectation = UNSET
    #: The request itself holds a chat template's turn marker (a pasted transcript, a raw
    #: prompt in a template's format): the answer may write one, so turns are not judged.
    quotes_turns: bool = False


def _request_logprobs(out: dict[str, Any], endpoint: Endpoint) -> bool:
    """Ask for the sampled token's log-probability when the client asked for none: on chat
    ``logprobs: true`` with no alternatives (``top_logprobs: 0``), on completions ``logprobs: 1``
    (the completions API has no "chosen token only"). Returns whether it asked; a client that
    sent any logprobs field keeps exactly what it asked for."""
    if endpoint == "chat":
        if out.get("logprobs") or out.get("top_logprobs") is not None:
            return False
        out["logprobs"] = True
        out["top_logprobs"] = 0
        return True
    if out.get("logprobs") is not None:
        return False
    out["logprobs"] = 1
    return True


def rewrite_request(
    body: Any,
    endpoint: Endpoint,
    policy: RewritePolicy,
    *,
    usage_options: bool = True,
    engine_limit: int | None = None,
    language: str | None = None,
) -> Rewrite:
    """Validate the fields the guard relies on and build the upstream request.

    The client's dict is not modified. ``usage_options=False`` is the fallback for engines that
    reject ``stream_options`` (or its vLLM-only ``continuous_usage_stats``): the client's own
    stream options are then passed through unchanged. ``engine_limit`` is the largest limit the
    engine accepts for this request (the model's context, :mod:`proxy.server.engine_context`), when
    known: a default above it is never sent. ``language`` is the client's own setting
    (``x-guard-language``, already validated; ``none`` for no expectation), which wins over
    everything the request says.
    """
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    if endpoint in SURFACE_LIMIT:
        return _rewrite_surface(dict(body), endpoint, policy, engine_limit, language)
    out = dict(body)

    model = _optional(out, "model", str)
    client_stream = bool(_optional(out, "stream", bool))
    n = _optional(out, "n", int)
    if n is not None and n < 1:
        raise BadRequest("'n' must be at least 1.", param="n")
    _check_input(out, endpoint)

    client_options = _optional(out, "stream_options", dict)
    if client_options is not None and not client_stream:
        raise BadRequest(
            "Stream options can only be defined when `stream=True`.", param="stream_options"
        )
    include_usage = (client_options or {}).get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise BadRequest(
            "'stream_options.include_usage' must be a boolean.", param="stream_options"
        )

    _apply_sampling_defaults(out, model, policy.sampling_defaults)
    max_tokens, action, header = _limit_max_tokens(out, endpoint, policy, engine_limit)
    turns = request_turns(out, endpoint)
    expectation = expect_language(out, endpoint, policy, language, turns=turns)
    injected = constrain_language(out, endpoint, policy.language, expectation)

    out["stream"] = True
    if usage_options and policy.request_usage:
        options = dict(client_options or {})
        options["include_usage"] = True
        options["continuous_usage_stats"] = True
        out["stream_options"] = options
    elif client_options is None:
        out.pop("stream_options", None)
    injected_logprobs = policy.request_logprobs and _request_logprobs(out, endpoint)

    return Rewrite(
        body=out,
        model=model,
        client_stream=client_stream,
        client_wants_usage=include_usage if client_stream else True,
        max_tokens=max_tokens,
        max_tokens_action=None if action == "engine" else action,
        max_tokens_header=header,
        expected_language=expectation.code,
        injected_language=injected,
        structured=_is_structured(out),
        n=n or 1,
        injected_logprobs=injected_logprobs,
        engine_limited=action == "engine",
        expectation=expectation,
        quotes_turns=quotes_turns(text for _, text in turns),
    )


def _rewrite_surface(
    out: dict[str, Any],
    endpoint: Endpoint,
    policy: RewritePolicy,
    engine_limit: int | None,
    language: str | None,
) -> Rewrite:
    """``rewrite_request`` for ``/v1/responses`` and ``/v1/messages`` (see the module docstring)."""
    model = _optional(out, "model", str)
    client_stream = bool(_optional(out, "stream", bool))
    if endpoint == "responses":
        value = out.get("input")
        if not isinstance(value, (str, list)):
            raise BadRequest("'input' must be a string or an array of input items.", param="input")
        _optional(out, "instructions", str)
    else:
        messages = out.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty array.", param="messages")
        system = out.get("system")
        if system is not None and not isinstance(system, (str, list)):
            raise BadRequest("'system' must be a string or an array of blocks.", param="system")

    allowed = SURFACE_SAMPLING_FIELDS[endpoint]
    if policy.sampling_defaults and model is not None:
        defaults = {
            pattern: {k: v for k, v in fields.items() if k in allowed}
            for pattern, fields in policy.sampling_defaults.items()
        }
        _apply_sampling_defaults(out, model, defaults)
    max_tokens, action, header = _limit_surface_tokens(out, endpoint, policy, engine_limit)
    turns = request_turns(out, endpoint)
    expectation = expect_language(out, endpoint, policy, language, turns=turns)
    injected = constrain_surface_language(out, endpoint, policy.language, expectation)
    out["stream"] = True
    fmt = out.get("text")
    fmt = fmt.get("format") if isinstance(fmt, dict) else None
    structured = isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")
    return Rewrite(
        body=out,
        model=model,
        client_stream=client_stream,
        client_wants_usage=True,
        max_tokens=max_tokens,
        max_tokens_action=None if action == "engine" else action,
        max_tokens_header=header,
        expected_language=expectation.code,
        injected_language=injected,
        structured=structured or out.get("structured_outputs") is not None,
        n=1,
        engine_limited=action == "engine",
        expectation=expectation,
        quotes_turns=quotes_turns(text for _, text in turns),
    )


def _default_limit(
    body: dict[str, Any], field: str, default: int, engine_limit: int | None
) -> tuple[int, str | None, str]:
    """The limit of a request that set none: ``default``, unless the engine's own limit — the
    rest of its context, at most ``engine_limit`` — is already within it; then none is sent
    (a default above the context is a 400 on vLLM, and the rest of the context is exactly what
    a default cut to fit would be, whatever the prompt's length)."""
    if engine_limit is not None and engine_limit <= default:
        return engine_limit, "engine", f"engine; value={engine_limit}"
    body[field] = default
    return default, "defaulted", f"defaulted; value={default}"


def _limit_surface_tokens(
    body: dict[str, Any], endpoint: Endpoint, policy: RewritePolicy, engine_limit: int | None
) -> tuple[int, str | None, str]:
    field = SURFACE_LIMIT[endpoint]
    value = _optional(body, field, int)
    cap = policy.max_tokens_cap
    if value is None:
        if endpoint == "messages":
            raise BadRequest("'max_tokens' is required.", param="max_tokens")
        return _default_limit(body, field, min(policy.max_tokens_default, cap), engine_limit)
    if value < 1:
        raise BadRequest(f"'{field}' must be at least 1.", param=field)
    if value <= cap:
        return value, None, f"unchanged; value={value}"
    if policy.max_tokens_policy == "reject":
        raise BadRequest(
            f"'{field}' is {value}, above this deployment's limit of {cap}.",
            param=field,
            code="max_tokens_over_cap",
        )
    body[field] = cap
    return cap, "clamped", f"clamped; value={cap}; requested={value}"


def _optional(body: dict[str, Any], field: str, kind: type) -> Any:
    value = body.get(field)
    # bool is an int subclass: {"max_tokens": true} must not pass as 1.
    if value is None or (isinstance(value, kind) and not (kind is int and isinstance(value, bool))):
        return value
    raise BadRequest(f"'{field}' must be of type {_TYPE_NAMES[kind]}.", param=field)


_TYPE_NAMES = {str: "string", bool: "boolean", int: "integer", dict: "object", list: "array"}


def _check_input(body: dict[str, Any], endpoint: Endpoint) -> None:
    if endpoint == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty array.", param="messages")
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise BadRequest(f"'messages[{i}]' must be an object.", param=f"messages[{i}]")
    else:
        prompt = body.get("prompt")
        if not (
            isinstance(prompt, str)
            or (isinstance(prompt, list) and prompt and _is_prompt_list(prompt))
        ):
            raise BadRequest(
                "'prompt' must be a string, an array of strings, or an array of token ids.",
                param="prompt",
            )


def _is_prompt_list(prompt: list[Any]) -> bool:
    first = prompt[0]
    if isinstance(first, str):
        return all(isinstance(p, str) for p in prompt)
    if isinstance(first, int):
        return all(isinstance(p, int) and not isinstance(p, bool) for p in prompt)
    return all(isinstance(p, list) and _is_prompt_list(p) for p in prompt if p)


def _apply_sampling_defaults(
    body: dict[str, Any], model: str | None, defaults: Mapping[str, Mapping[str, Any]] | None
) -> None:
    """Fill fields the client left unset; an exact model name wins over globs, earlier globs
    over later ones."""
    if not defaults or model is None:
        return
    patterns = [defaults[model]] if model in defaults else []
    patterns += [v for k, v in defaults.items() if k != model and fnmatch.fnmatchcase(model, k)]
    for fields in patterns:
        for key, value in fields.items():
            if body.get(key) is None:
                body[key] = copy.deepcopy(value)


def _limit_max_tokens(
    body: dict[str, Any], endpoint: Endpoint, policy: RewritePolicy, engine_limit: int | None
) -> tuple[int, str | None, str]:
    fields = ("max_completion_tokens", "max_tokens") if endpoint == "chat" else ("max_tokens",)
    requested = {}
    for field in fields:
        value = _optional(body, field, int)
        if value is not None:
            if value < 1:
                raise BadRequest(f"'{field}' must be at least 1.", param=field)
            requested[field] = value

    if not requested:
        default = (
            policy.max_tokens_default if endpoint == "chat" else COMPLETIONS_DEFAULT_MAX_TOKENS
        )
        return _default_limit(body, "max_tokens", min(default, policy.max_tokens_cap), engine_limit)

    cap = policy.max_tokens_cap
    over = {f: v for f, v in requested.items() if v > cap}
    # Chat uses max_completion_tokens when both are set, as vLLM does.
    effective_field = next(f for f in fields if f in requested)
    if not over:
        limit = requested[effective_field]
        return limit, None, f"unchanged; value={limit}"
    if policy.max_tokens_policy == "reject":
        field, value = next(iter(over.items()))
        raise BadRequest(
            f"'{field}' is {value}, above this deployment's limit of {cap}.",
            param=field,
            code="max_tokens_over_cap",
        )
    for field in over:
        body[field] = cap
    limit = min(requested[effective_field], cap)
    return limit, "clamped", f"clamped; value={limit}; requested={requested[effective_field]}"


def expect_language(
    body: dict[str, Any],
    endpoint: Endpoint,
    policy: RewritePolicy,
    header: str | None = None,
    *,
    turns: list[tuple[Role, str]] | None = None,
) -> Expectation:
    """The languages the answer may be in (see :mod:`proxy.core.requested_language`).

    Declared languages narrow: the client's ``x-guard-language`` wins, then a language the
    operator pinned (``GUARD_LANGUAGE=<code>``). Otherwise the request is read: an unambiguous
    instruction narrows, everything else (the conversation's own languages, English included,
    and every language named) only widens what is accepted. With no instruction to inject
    (``GUARD_LANGUAGE=off``), ``GUARD_EXPECT_LANGUAGE=off`` keeps only what is declared.
    ``turns`` are the body's :func:`request_turns` when the caller has them already.
    """
    if header is not None:
        if header in ("none", "off"):
            return Expectation(None, "none", "header")
        return Expectation(header, "request", "header")
    setting = policy.language
    if setting not in ("off", "auto"):
        return Expectation(setting, "config", "config")
    if setting == "off" and policy.expect_language != "prompt":
        return Expectation(None, "none", "off")
    return derive(turns if turns is not None else request_turns(body, endpoint))


def _is_structured(body: dict[str, Any]) -> bool:
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        return True
    return any(body.get(k) is not None for k in ("guided_json", "structured_outputs"))
