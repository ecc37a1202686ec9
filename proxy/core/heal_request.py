"""What heal asks the engine: which requests can be healed, and the continuation request.

* :class:`HealPolicy` — the GUARD_HEAL_* settings, resolved once.
* :func:`unhealable` — why a request cannot be healed (then it is relayed as ``enforce``).
* :func:`continuation_request` — the body that asks the engine to go on from the trimmed text:
  chat appends it as a final assistant message with vLLM's ``continue_final_message``;
  completions appends it to the prompt. Each attempt turns the anti-repetition up one step, up
  to a bound, with vLLM's own exact-loop stop as a backstop.

Pure: dicts in, dicts out. The stage that relays and judges a continuation is
:class:`proxy.core.heal.HealGuard`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from proxy.core.chunks import Piece
from proxy.core.records import Endpoint
from proxy.detect import Summary, Verdict

if TYPE_CHECKING:
    from proxy.settings import Settings


#: vLLM's exact-loop stop (``repetition_detection``), sent as a backstop on continuations: an
#: n-gram of 2..64 tokens repeated 8 times in a row ends the continuation at the engine.
REPETITION_DETECTION: dict[str, int] = {
    "max_pattern_size": 64,
    "min_pattern_size": 2,
    "min_count": 8,
}


#: Highest penalties a continuation asks for (vLLM's own bounds are 2.0 for both).
_MAX_PENALTY = 2.0


_MAX_TEMPERATURE = 2.0


@dataclass(frozen=True, slots=True)
class HealPolicy:
    """How heal mode retries, resolved once from the GUARD_HEAL_* settings."""

    max_attempts: int = 2
    holdback_tokens: int = 64
    repetition_penalty_step: float = 0.1
    frequency_penalty_step: float = 0.3
    presence_penalty_step: float = 0.0
    temperature_step: float = 0.3
    repetition_detection: bool = True
    #: Hold-back window of a continuation stage (tokens): a continuation that degenerates is
    #: cut back to where it went wrong, so the window must span the detection delay of the
    #: signals that watch it (gibberish and salad need a few hundred characters).
    continuation_holdback_tokens: int = 160
    #: How far anti-repetition rises over the attempts (never below what the client asked):
    #: SmolLM2-135M on vLLM writes real-word salad from (1.3, 0.9, 0.6) on and gibberish from
    #: (1.6, 1.5, 0.9) (bench/data/gibberish.jsonl), so the bound stays at the second step.
    max_repetition_penalty: float = 1.2
    max_frequency_penalty: float = 0.6
    max_temperature: float = 0.6
    #: Share of a continuation's prose words missing from its language's word list above which
    #: (and above the kept answer's own share) it is not a heal (1.0: not judged).
    max_unknown_share: float = 0.2

    @classmethod
    def from_settings(cls, settings: Settings) -> HealPolicy:
        return cls(
            max_attempts=settings.heal_max_attempts,
            holdback_tokens=settings.heal_holdback_tokens,
            repetition_penalty_step=settings.heal_repetition_penalty_step,
            frequency_penalty_step=settings.heal_frequency_penalty_step,
            presence_penalty_step=settings.heal_presence_penalty_step,
            temperature_step=settings.heal_temperature_step,
            repetition_detection=settings.heal_repetition_detection,
            continuation_holdback_tokens=settings.heal_continuation_holdback_tokens,
            max_unknown_share=settings.heal_max_unknown_share,
        )


def unhealable(
    endpoint: Endpoint, body: dict[str, Any], n: int, *, client_stream: bool = False
) -> str | None:
    """Why this request cannot be healed (``None``: it can). Such requests are relayed as
    ``enforce`` would relay them.

    Only chat and completions have a way to continue a text (Responses and Messages requests
    are healed through the chat route when :mod:`proxy.core.surfaces.via_chat` can express them,
    and reach this check as chat); ``n > 1`` would need one continuation per choice with
    the others held back meanwhile; a completions prompt must be one string (token ids cannot
    be extended with text, and several prompts are several answers); ``echo`` would repeat the
    extended prompt.
    """
    if endpoint not in ("chat", "completions"):
        return "surface"
    if n != 1:
        return "n"
    if constrained(body) and client_stream:
        # A constrained answer cannot be continued (the engine's grammar starts again at the
        # continuation's first token), and a restart would follow what the client already read.
        return "constrained-stream"
    if endpoint == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            if len(prompt) != 1 or not isinstance(prompt[0], str):
                return "prompt"
        elif not isinstance(prompt, str):
            return "prompt"
        if body.get("echo"):
            return "echo"
    else:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return "messages"
    return None


#: Request fields that constrain the output to a grammar (vLLM's structured outputs).
_CONSTRAINTS = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
)


def constrained(body: dict[str, Any]) -> bool:
    """Whether the request constrains its output to a grammar (``response_format`` with a JSON
    type, or one of vLLM's guided/structured-output fields)."""
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        return True
    return any(body.get(k) is not None for k in _CONSTRAINTS)


def json_constrained(body: dict[str, Any]) -> bool:
    """Whether the constraint is JSON (then a healed answer must parse as JSON)."""
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        return True
    so = body.get("structured_outputs")
    if isinstance(so, dict) and so.get("json") is not None:
        return True
    return body.get("guided_json") is not None


def valid_json(text: str) -> bool:
    """``text`` is one JSON value under the strict grammar (no raw control characters inside
    strings), as the openai SDK's ``.parse()`` and pydantic read it."""
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def continuation_request(
    body: dict[str, Any],
    endpoint: Endpoint,
    prefix: str,
    remaining_tokens: int,
    attempt: int,
    policy: HealPolicy,
    *,
    restart: bool = False,
) -> dict[str, Any]:
    """The request for attempt ``attempt`` (1, 2, ...): ``body`` (the rewritten request the
    first stage sent) continued from ``prefix`` with at most ``remaining_tokens`` new tokens
    (``restart``: the same request asked again, for a constrained answer, with the attempt's
    anti-repetition).

    Anti-repetition grows with the attempt: ``repetition_penalty`` (prompt and output tokens, so
    it also weighs against repeating the kept text) and ``frequency``/``presence_penalty``
    (output tokens only) by their steps; a greedy request (``temperature`` 0) gets a temperature
    step, since greedy decoding from the same prefix tends to walk back into the same loop.
    """
    out = copy.deepcopy(body)
    if restart:
        pass
    elif endpoint == "chat":
        messages = list(out.get("messages") or [])
        last = messages[-1] if messages else None
        if (
            out.get("continue_final_message")
            and isinstance(last, dict)
            and last.get("role") == "assistant"
            and isinstance(last.get("content"), str)
        ):
            messages[-1] = {**last, "content": last["content"] + prefix}
        else:
            messages.append({"role": "assistant", "content": prefix})
        out["messages"] = messages
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    else:
        prompt = out.get("prompt")
        if isinstance(prompt, list):
            out["prompt"] = [prompt[0] + prefix]
        else:
            out["prompt"] = str(prompt) + prefix
    out["n"] = 1
    limited = False
    for key in ("max_tokens", "max_completion_tokens"):
        if key in out and out[key] is not None:
            out[key] = remaining_tokens
            limited = True
    if not limited:
        out["max_tokens"] = remaining_tokens
    if policy.repetition_penalty_step:
        base = max(_number(out.get("repetition_penalty"), 1.0), 1.0)
        raised = min(policy.max_repetition_penalty, base + policy.repetition_penalty_step * attempt)
        out["repetition_penalty"] = round(min(_MAX_PENALTY, max(base, raised)), 4)
    if policy.frequency_penalty_step:
        base = _number(out.get("frequency_penalty"), 0.0)
        raised = min(policy.max_frequency_penalty, base + policy.frequency_penalty_step * attempt)
        out["frequency_penalty"] = round(min(_MAX_PENALTY, max(base, raised)), 4)
    if policy.presence_penalty_step:
        base = _number(out.get("presence_penalty"), 0.0)
        out["presence_penalty"] = round(
            min(_MAX_PENALTY, base + policy.presence_penalty_step * attempt), 4
        )
    if policy.temperature_step and _number(out.get("temperature"), 1.0) == 0:
        raised = min(policy.max_temperature, policy.temperature_step * attempt)
        out["temperature"] = round(min(_MAX_TEMPERATURE, raised), 4)
    if policy.repetition_detection and "repetition_detection" not in out:
        out["repetition_detection"] = dict(REPETITION_DETECTION)
    return out


def _number(value: Any, default: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return float(value)


#: Signals of a continuation that more anti-repetition only makes worse: the raised penalties
#: push a small model off its own words (gibberish, salad, another script or language).
NO_RETRY_SIGNALS: frozenset[str] = frozenset(
    {"gibberish", "salad", "script-intrusion", "language-drift", "entropy-collapse"}
)


@dataclass(slots=True)
class HealCarry:
    """What a stage hands the next one: the answer so far and the history of the heal."""

    prefix: str = ""
    #: Tokens of ``prefix`` (the kept text of earlier stages).
    base_tokens: int = 0
    #: The first response's id/object/created/model (the client's view).
    origin: dict[str, Any] | None = None
    prompt_tokens: int | None = None
    attempt: int = 0
    #: Tokens generated by the engine and cut away, over all earlier stages.
    discarded: int = 0
    #: Tokens the engine generated over all earlier stages (kept and discarded).
    generated: int = 0
    first_verdict: Verdict | None = None
    first_onset: int | None = None
    first_summary: Summary | None = None
    #: Non-streaming: the kept pieces of earlier stages (offsets in the whole answer).
    pieces: list[tuple[int, Piece]] = field(default_factory=list)
    #: The language the kept answer is written in, which its continuations are held to.
    language: str | None = None
