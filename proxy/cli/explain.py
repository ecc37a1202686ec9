"""What each ``GUARD_*`` variable does: the one source of meanings.

``coherence-guard config --explain`` prints it next to the current values, and
``scripts/env_example.py`` renders it into ``.env.example`` and the README's table, so the three
cannot disagree. It lives in the package (not the script) because an installed wheel has no
``scripts/``.

Meanings: a Settings field's ``Field(description=...)`` if it has one, else :data:`SETTINGS_HELP`;
a DetectorConfig field's ``metadata["help"]`` if it has one, else the comment block above it in
the source (the detector documents its knobs by comments).
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import tokenize

from proxy.detect import DetectorConfig
from proxy.settings import Settings

SETTINGS_HELP: dict[str, str] = {
    "upstream_url": "Base URL of the OpenAI-compatible engine the proxy fronts (vLLM, ...): "
    "http(s)://HOST:PORT (a trailing /v1 is dropped: the proxy forwards whole paths).",
    "host": "Address the proxy listens on.",
    "port": "Port the proxy listens on.",
    "workers": "uvicorn worker processes; above 1, metrics switch to prometheus-client "
    "multiprocess mode (PROMETHEUS_MULTIPROC_DIR).",
    "mode": "enforce: abort degenerate generations at the engine; monitor: detect and count "
    "only (action=observed); off: plain relay; heal: cut a loop back to its onset and let the "
    "engine continue the same answer (GUARD_HEAL_*).",
    "allow_client_override": "Let a request pick its own mode with the x-guard-mode header.",
    "abort_finish_reason": "finish_reason the client sees on an aborted choice (content_filter "
    "is in the OpenAI enum; repetition is vLLM's own and strict clients reject it).",
    "responses_abort_event": "How an aborted /v1/responses stream ends: completed = as vLLM "
    "ends a response it stopped early (response.completed with status incomplete; the openai "
    "SDK's stream helper and openai-agents accept it); incomplete = a response.incomplete event.",
    "retry_after_abort": "A request aborted as a loop and sent again unchanged within "
    "GUARD_RETRY_WINDOW: heal = answer the retry in heal mode (structured answers: defend); "
    "defend = enforce with raised repetition/frequency penalties (and a temperature step for "
    "greedy requests); off = treat it as any request.",
    "retry_window": "Seconds an aborted request is remembered for GUARD_RETRY_AFTER_ABORT "
    "(0 = never).",
    "retry_memory": "Aborted requests remembered per worker and route (16-byte digests of the "
    "body, never its text); the least recently aborted go first.",
    "trim_on_abort": "Cut a non-streaming answer at the detected onset of degeneration.",
    "max_tokens_default": "max_tokens given to requests that set none (the engine would "
    "otherwise generate up to the context window); at most GUARD_MAX_TOKENS_CAP. Where the "
    "model's context (max_model_len in /v1/models) is within it, none is sent: the engine's own "
    "limit, the rest of the context, applies.",
    "max_tokens_cap": "Largest max_tokens / max_completion_tokens a request may ask for.",
    "max_tokens_policy": "Above the cap: clamp it, or reject the request with a 400.",
    "language": "Language constraint: off, auto (the language the request declares or asks "
    "for outright, never one only read from the text; see docs/language.md) or a "
    "two-letter ISO 639-1 code (en, it, zh, ...; not a name like english); injects an "
    "instruction and tells the detector what to expect.",
    "sampling_defaults": "JSON object: model name or glob -> sampling fields filled in when a "
    'request leaves them unset, e.g. {"qwen*": {"repetition_penalty": 1.05}}.',
    "request_usage": "Ask the engine for usage in every chunk (exact token counts for "
    "positions and tokens saved).",
    "max_body_bytes": "Largest request body accepted (413 above).",
    "connect_timeout": "Seconds to connect to the engine.",
    "read_timeout": "Seconds the engine may stay silent mid-response.",
    "api_keys": 'Accepted bearer keys: a JSON list (["k1","k2"]) or comma-separated (k1,k2); '
    "empty: no auth.",
    "log_text": "Log prompt and completion text (off by default: it is user data).",
    "log_level": "debug, info, warning, error or critical (the proxy's and uvicorn's logs).",
    "metrics_max_models": "Distinct model label values in the metrics. Once the engine's "
    "/v1/models is known, only models it lists (or GUARD_SAMPLING_DEFAULTS names) get their "
    "own label; before that, the first ones seen. The rest count as model=other.",
    "upstream_metrics_interval": "Seconds between scrapes of the engine's /metrics for its "
    "KV cache dtype (fp8 warning); 0 turns it off.",
    "upstream_api_key": "Bearer key the proxy sends to the engine (replaces the client's "
    "Authorization); unset: the client's header is passed on.",
    "upstream_tls_verify": "Verify the engine's TLS certificate (https upstreams).",
    "upstream_ca_bundle": "PEM file of CAs trusted for the engine; unset: the system store.",
    "upstream_client_cert": "PEM client certificate for mutual TLS with the engine.",
    "upstream_client_key": "PEM key of the client certificate (if not inside it).",
    "write_timeout": "Seconds a write of a request to the engine may take.",
    "upstream_max_connections": "Connections to the engine kept per worker.",
    "unguarded_routes": "Engine routes that generate text but are not guarded: pass (relay, "
    "warning at start-up) or reject (403).",
    "max_event_bytes": "Largest single SSE event accepted from the engine; a larger one ends "
    "the stream with an error.",
    "client_write_timeout": "Seconds a client may accept no bytes before it is dropped and the "
    "engine's generation closed.",
    "request_deadline": "Overall seconds one request may take (0: no limit).",
    "prompt_count_timeout": "Seconds an aborted answer may wait for the engine's count of its "
    "prompt (POST /tokenize), asked only when the engine sent none before the abort; without "
    "it the usage leaves the count out (never 0). 0: never ask.",
    "log_format": "text or json (one JSON object per line).",
    "access_log": "Log one line per request (client, method, path, status, request id), "
    "in GUARD_LOG_FORMAT.",
    "override_api_keys": "Keys allowed to send x-guard-mode (JSON list or comma-separated); "
    "empty: any client (when GUARD_ALLOW_CLIENT_OVERRIDE is on).",
    "protect_metrics": "Require a key (GUARD_API_KEYS or GUARD_METRICS_API_KEYS) on /metrics, "
    "/metrics/quality and the engine's /metrics/engine (relayed).",
    "metrics_api_keys": "Keys that may read the metrics (scrapers) when GUARD_PROTECT_METRICS "
    "is on; a JSON list or comma-separated.",
    "expect_language": "Languages an answer may be in when GUARD_LANGUAGE injects none: prompt "
    "(what the request asks for, else the conversation's own languages and every language it "
    "names) or off (only what the client declares). With GUARD_ALLOW_CLIENT_OVERRIDE a client "
    "may set it per request (x-guard-language).",
    "upstream_check_interval": "Seconds between checks that the engine answers (/health, "
    "/v1/models): logged while it does not, and its model list bounds the metrics' model "
    "label; 0 turns the checks off.",
    "request_logprobs": "Ask the engine for each sampled token's log-probability on guarded "
    "chat/completions requests and feed it to the detector; removed from the client's stream "
    "unless the client asked for logprobs.",
    "heal_max_attempts": "heal mode: continuations one degenerate choice may get (each from "
    "the onset of the loop, with stronger anti-repetition) before it ends as in enforce.",
    "heal_continuation_holdback_tokens": "Text chunks held back from the client while a heal "
    "continuation is relayed: it spans the detection delay of gibberish and salad, so a "
    "continuation that degenerates is cut before the client sees it (0 = none).",
    "heal_max_unknown_share": "Share of a heal continuation's prose words unknown to its "
    "language's word list above which (and above the kept answer's own share) the answer ends "
    "as an abort instead of healed (1 = off).",
    "heal_holdback_tokens": "heal mode: text chunks the proxy holds back before forwarding, so "
    "a loop whose onset lies inside the window never reaches the client (the text runs this "
    "many tokens behind; inter-token latency is unchanged); 0 turns it off.",
    "heal_repetition_penalty_step": "heal mode: repetition_penalty added per attempt (from "
    "the request's, at least 1.0; at most 2.0).",
    "heal_frequency_penalty_step": "heal mode: frequency_penalty added per attempt (at most 2.0).",
    "heal_presence_penalty_step": "heal mode: presence_penalty added per attempt (at most 2.0).",
    "heal_temperature_step": "heal mode: temperature per attempt for a greedy request "
    "(temperature 0), so the continuation does not walk back into the same loop.",
    "heal_repetition_detection": "heal mode: ask vLLM's repetition_detection on continuations "
    "(the engine stops an exact token loop itself).",
}


def comment_blocks(cls: type) -> dict[str, str]:
    """Field name -> the comment lines nearest above it within its blank-line-separated group."""
    source = inspect.getsource(cls)
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    out: dict[str, str] = {}
    names = {f.name for f in dataclasses.fields(cls)}
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        name = stripped.split(":", 1)[0].strip()
        if name not in names or line.startswith(" " * 8):
            continue
        block: list[str] = []
        row = number - 1
        while row >= 1 and lines[row - 1].strip():  # walk up within the group
            if row in comments and lines[row - 1].strip().startswith("#"):
                block.insert(0, comments[row])
            elif block:
                break
            row -= 1
        if block:
            out[name] = " ".join(block)
    return out


def settings_meaning(name: str) -> str | None:
    """Meaning of the Settings field ``name``, or None when it has none (an error in CI)."""
    info = Settings.model_fields[name]
    return info.description or SETTINGS_HELP.get(name)


def detector_meanings() -> dict[str, str]:
    """DetectorConfig field name -> meaning (fields without one are left out)."""
    comments = comment_blocks(DetectorConfig)
    out: dict[str, str] = {}
    for f in dataclasses.fields(DetectorConfig):
        meaning = f.metadata.get("help") or comments.get(f.name)
        if meaning:
            out[f.name] = meaning
    return out


def meanings() -> dict[str, str]:
    """``GUARD_*`` name -> meaning, settings first, then the detector's knobs."""
    out = {}
    for name in Settings.model_fields:
        meaning = settings_meaning(name)
        if meaning:
            out["GUARD_" + name.upper()] = meaning
    for name, meaning in detector_meanings().items():
        out["GUARD_" + name.upper()] = meaning
    return out
