"""``coherence-guard check``: a three-tier coherence check of a deployment.

Throughput numbers are worthless if the model is producing garbage fast: a wrong chat template,
an uncalibrated FP8 KV cache or a broken quantization all show up as loops, floods or drift long
before they show up in a latency graph. This command asks the deployment three things a healthy
instruction-tuned model answers easily, greedily (so a rerun gives the same answer):

1. a short factual answer (the capital of France; expects "Paris" and ``finish_reason=stop``),
2. a ~300-word story (the long free text where loops and drift appear),
3. an iterative Fibonacci function with a docstring (structured output that must parse).

Each answer is streamed through the same :class:`~proxy.detect.Detector` the proxy uses (with the
``GUARD_*`` detector thresholds of the environment) plus simple per-tier checks. It works against
the engine directly or through the proxy; through the proxy, a guard abort shows up as a finish
reason other than ``stop`` and is reported as degenerate.

Exit status: 0 every tier coherent, 1 at least one tier degenerate or failing its checks,
2 the server could not be reached or did not answer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    import httpx

    from proxy.detect import DetectorConfig

EXIT_COHERENT = 0
EXIT_DEGENERATE = 1
EXIT_UNREACHABLE = 2

#: Shown as the finish reason of a stream that check hung up on after the detector's verdict.
_CLOSED = "(closed)"

#: Characters of each answer shown in the report.
PREVIEW_CHARS = 200


@dataclass(frozen=True, slots=True)
class Tier:
    """One question of the check and the checks its answer must pass."""

    name: str
    prompt: str
    max_tokens: int
    #: Returns a list of failed-check descriptions (empty: the answer passes).
    checks: Callable[[str], list[str]]


def _check_factual(text: str) -> list[str]:
    return [] if "paris" in text.lower() else ['answer does not mention "Paris"']


def _check_story(text: str) -> list[str]:
    words = len(text.split())
    return [] if words >= 80 else [f"story has {words} words, expected at least 80"]


def _code_of(text: str) -> str:
    """The first fenced code block of a Markdown answer, else the whole answer."""
    start = text.find("```")
    if start < 0:
        return text
    body_start = text.find("\n", start)
    if body_start < 0:
        return text
    end = text.find("```", body_start)
    return text[body_start + 1 : end if end >= 0 else len(text)]


def _check_code(text: str) -> list[str]:
    code = _code_of(text)
    failed = []
    if "def " not in code:
        failed.append("no function definition")
    if '"""' not in code and "'''" not in code:
        failed.append("no docstring")
    if "for " not in code and "while " not in code:
        failed.append("no loop (asked for an iterative function)")
    try:
        # compile() only parses: nothing the model wrote is executed.
        compile(code, "<answer>", "exec")
    except (SyntaxError, ValueError) as exc:
        failed.append(f"code does not parse: {exc.msg if isinstance(exc, SyntaxError) else exc}")
    return failed


TIERS: tuple[Tier, ...] = (
    Tier(
        "factual",
        "What is the capital of France? Answer in one short sentence.",
        200,
        _check_factual,
    ),
    Tier(
        "story",
        "Write a story of about 300 words about a lighthouse keeper who finds a message in a "
        "bottle.",
        700,
        _check_story,
    ),
    Tier(
        "code",
        "Write an iterative Python function fibonacci(n) that returns the n-th Fibonacci "
        "number. Include a docstring. Reply with the code only.",
        500,
        _check_code,
    ),
)


@dataclass(slots=True)
class TierResult:
    name: str
    verdict: str = "coherent"  # coherent | DEGENERATE | FAILED
    finish_reason: str | None = None
    tokens: int = 0
    seconds: float = 0.0
    text: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def coherent(self) -> bool:
        return self.verdict == "coherent"


class Unreachable(Exception):
    """The server could not be reached, or answered with an error instead of a completion."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Ask the deployment three questions (a fact, a story, a function), greedily, and judge "
        "each answer with the detector (GUARD_* thresholds) and simple checks."
    )
    parser.epilog = (
        "exit status: 0 every tier coherent, 1 at least one degenerate or failing its checks, "
        "2 server unreachable or answering with errors"
    )
    parser.add_argument(
        "--url",
        required=True,
        help="base URL of the engine or of the proxy (e.g. http://127.0.0.1:8000; a /v1 suffix "
        "is accepted)",
    )
    parser.add_argument(
        "--model", help="model name; by default the first one the server lists at /v1/models"
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="bearer token (default: $OPENAI_API_KEY)",
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds allowed per answer (default 300)"
    )
    parser.add_argument(
        "--extra-body",
        type=_json_object,
        default={},
        metavar="JSON",
        help="extra request fields merged into every request, e.g. the sampling parameters "
        "production uses: '{\"repetition_penalty\": 1.1}'",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the results as JSON instead of the report"
    )


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def _base_url(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _discover_model(client: httpx.Client) -> str:
    response = client.get("/v1/models")
    if response.status_code != 200:
        raise Unreachable(f"GET /v1/models answered HTTP {response.status_code}")
    models = response.json().get("data") or []
    if not models:
        raise Unreachable("GET /v1/models lists no model; pass --model")
    return str(models[0]["id"])


def _sse_data(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Yield the payload of each ``data:`` line; lines end at CR, LF or CRLF only."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        while True:
            cut = min((i for i in (buffer.find(b"\n"), buffer.find(b"\r")) if i >= 0), default=-1)
            # A CR at the very end may be the first half of a CRLF: wait for the next chunk.
            if cut < 0 or (buffer[cut : cut + 1] == b"\r" and cut == len(buffer) - 1):
                break
            line = buffer[:cut]
            step = 2 if buffer[cut : cut + 2] == b"\r\n" else 1
            buffer = buffer[cut + step :]
            if line.startswith(b"data:"):
                yield line[5:].lstrip(b" ")
    # What is left holds no LF, and a CR only at its very end (the held-back line end).
    line = buffer.removesuffix(b"\r")
    if line.startswith(b"data:"):
        yield line[5:].lstrip(b" ")


def _run_tier(
    client: httpx.Client,
    model: str,
    tier: Tier,
    extra_body: dict[str, Any],
    timeout: float,
    config: DetectorConfig,
) -> TierResult:
    from proxy.detect import Detector

    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": tier.prompt}],
        "max_tokens": tier.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra_body,
    }
    result = TierResult(tier.name)
    detector = Detector(config)
    parts: list[str] = []
    usage_tokens: int | None = None
    guarded: str | None = None
    started = time.monotonic()
    with client.stream("POST", "/v1/chat/completions", json=body, timeout=timeout) as response:
        if response.status_code != 200:
            response.read()
            raise Unreachable(
                f"POST /v1/chat/completions answered HTTP {response.status_code}: "
                f"{response.text[:300]}"
            )
        for data in _sse_data(response.iter_bytes()):
            if data == b"[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                result.problems.append(f"stream error: {event['error'].get('message')}")
                result.finish_reason = "error"
                continue
            if event.get("usage"):
                usage_tokens = event["usage"].get("completion_tokens", usage_tokens)
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                piece = delta.get("content") or ""
                if piece:
                    parts.append(piece)
                    result.tokens += 1
                    verdict = detector.feed(piece, tokens=1)
                    if verdict is not None:
                        result.problems.append(
                            f"detector: {verdict.signal} at token {verdict.fired_at_token}"
                        )
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
                    guard = choice.get("guard")
                    if isinstance(guard, dict) and guard.get("action") == "aborted":
                        guarded = f"the proxy's guard aborted it ({guard.get('signal')})"
            if detector.verdict is not None:
                # The answer is judged: closing the stream makes the engine stop generating
                # the rest of the loop instead of running on to max_tokens.
                result.finish_reason = result.finish_reason or _CLOSED
                break
    result.seconds = time.monotonic() - started
    result.text = "".join(parts)
    if usage_tokens is not None:
        result.tokens = usage_tokens
    if detector.verdict is not None:
        result.verdict = "DEGENERATE"
    if result.finish_reason not in ("stop", _CLOSED):
        result.verdict = "DEGENERATE"
        why = " (ran to max_tokens)" if result.finish_reason == "length" else ""
        result.problems.append(guarded or f"finish_reason {result.finish_reason!r}{why}")
    if result.finish_reason == _CLOSED:
        return result  # a cut-off answer: its content checks would only add noise
    failed = tier.checks(result.text)
    if failed:
        result.problems.extend(failed)
        if result.verdict == "coherent":
            result.verdict = "FAILED"
    return result


def check(
    url: str,
    *,
    model: str | None = None,
    api_key: str | None = None,
    timeout: float = 300.0,
    extra_body: dict[str, Any] | None = None,
    tiers: tuple[Tier, ...] = TIERS,
) -> tuple[str, list[TierResult]]:
    """Run the tiers; return the model name and one result per tier.

    Raises Unreachable, or ConfigError for invalid ``GUARD_*`` detector settings.
    """
    import httpx

    from proxy.settings import load_detector_config

    config = load_detector_config()

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(base_url=_base_url(url), headers=headers, timeout=30.0) as client:
            name = model or _discover_model(client)
            return name, [
                _run_tier(client, name, t, extra_body or {}, timeout, config) for t in tiers
            ]
    except httpx.HTTPError as exc:
        raise Unreachable(f"{type(exc).__name__}: {exc or 'no detail'}") from None
    except ValueError as exc:  # a body that is not the JSON an OpenAI server sends
        raise Unreachable(f"the server's answer is not OpenAI-compatible JSON: {exc}") from None


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat[:PREVIEW_CHARS] + ("…" if len(flat) > PREVIEW_CHARS else "")


def render_report(url: str, model: str, results: list[TierResult], out: TextIO) -> None:
    print(f"coherence check of {url} (model {model})\n", file=out)
    for number, r in enumerate(results, 1):
        print(f"[{number}] {r.name}: {_preview(r.text) or '(empty answer)'}\n", file=out)
    rows = [("tier", "verdict", "finish", "tokens", "tok/s", "problems")]
    for r in results:
        rate = f"{r.tokens / r.seconds:.1f}" if r.seconds > 0 else "-"
        rows.append(
            (
                r.name,
                r.verdict,
                str(r.finish_reason),
                str(r.tokens),
                rate,
                "; ".join(r.problems) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:5], widths, strict=True)]
        print("  ".join([*cells, row[5]]), file=out)
    bad = sum(not r.coherent for r in results)
    summary = "all tiers coherent" if not bad else f"{bad} of {len(results)} tiers not coherent"
    print(f"\n{summary}", file=out)


def run(args: argparse.Namespace) -> int:
    from proxy.settings import ConfigError

    try:
        model, results = check(
            args.url,
            model=args.model,
            api_key=args.api_key,
            timeout=args.timeout,
            extra_body=args.extra_body,
        )
    except Unreachable as exc:
        print(f"coherence-guard check: cannot check {args.url}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ConfigError as exc:
        print(f"coherence-guard check: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if args.json:
        payload = {"url": args.url, "model": model, "tiers": [asdict(r) for r in results]}
        print(json.dumps(payload, ensure_ascii=False, indent=2))
    else:
        render_report(args.url, model, results, sys.stdout)
    return EXIT_COHERENT if all(r.coherent for r in results) else EXIT_DEGENERATE
