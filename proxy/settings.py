"""Configuration: environment variables with the ``GUARD_`` prefix (and an optional ``.env``).

Read once, at start-up, into frozen objects; the hot path never looks at the environment.
Detector knobs are not listed here by hand: every field of :class:`DetectorConfig` becomes a
``GUARD_<FIELD>`` variable through :func:`load_detector_config`, so the detector owns its knobs.

Every value is checked here, not where it is first used: a wrong value must stop ``serve`` in
the parent process with one line that names the variable, the value and what is allowed, before
uvicorn starts workers (whose tracebacks an operator would have to dig out of the log), and it
must not be *accepted* when it means something other than what the operator thinks
(``GUARD_LANGUAGE=english`` would otherwise make every English answer count as drift).
Both pydantic's ``ValidationError`` and pydantic-settings' ``SettingsError`` (raised while the
environment is decoded, before validation) become :class:`ConfigError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, ValidationError, create_model, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from proxy.core.language_names import JUDGED, resolve
from proxy.detect import DetectorConfig

_ENV = SettingsConfigDict(
    env_prefix="GUARD_", env_file=".env", env_file_encoding="utf-8", extra="ignore", frozen=True
)

MASK = "***"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

#: The ISO 639-1 codes the language model (fastText ``lid.176``) can answer with
#: (``tests/test_settings.py`` checks this against the model file).
LANGUAGE_CODES = JUDGED

#: Fields whose values are secrets: never echoed in an error message.
SECRET_FIELDS = frozenset({"api_keys", "override_api_keys", "metrics_api_keys", "upstream_api_key"})
#: Fields given as a JSON list or a comma-separated string.
LIST_FIELDS = ("api_keys", "override_api_keys", "metrics_api_keys")

_SETTINGS_ERROR_FIELD = re.compile(r'field "([^"]+)"')


class ConfigError(Exception):
    """Invalid configuration; each of :attr:`problems` names the variable and what is allowed."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid configuration: " + "; ".join(problems))


def _split_list(value: Any) -> Any:
    """``["k1","k2"]`` (JSON) or ``k1,k2`` (what people type first) -> list of keys."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text:
        return []
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"not a valid JSON list ({exc.msg} at character {exc.pos}); write "
                '["k1","k2"] or k1,k2'
            ) from None
    return [part.strip() for part in text.split(",") if part.strip()]


def mask_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``; never raises (it also masks
    URLs that failed validation, for the error message)."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    if not at or not colon:
        return url
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{hostport}"))


def _check_upstream_url(value: str) -> str:
    text = value.strip()
    example = "e.g. http://vllm:8000"
    if "://" not in text:
        hint = f"; did you mean http://{mask_url('http://' + text)[7:]}?" if text else ""
        raise ValueError(f"must be an http:// or https:// URL with a host ({example}){hint}")
    parts = urlsplit(text)
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"must be an http:// or https:// URL ({example}), not {parts.scheme}://")
    try:
        parts.port  # noqa: B018 - the property validates the port
    except ValueError:
        raise ValueError(f"has an invalid port ({example})") from None
    if not parts.hostname:
        raise ValueError(f"has no host ({example})")
    if parts.query or parts.fragment:
        raise ValueError(f"must not have a query or fragment ({example})")
    if parts.path.rstrip("/").endswith("/v1"):
        # Given the OpenAI way (base_url ends in /v1): the proxy forwards whole paths
        # (/v1/..., /health), so the engine's root is meant.
        return text.rstrip("/")[: -len("/v1")]
    return text


def check_language(value: str, *, names: bool = False) -> str:
    """A language setting (off, auto, an ISO 639-1 code) as the code, else ValueError. With
    ``names`` (the ``x-guard-language`` header) a BCP-47 tag (``pt-BR``, ``zh-Hans-CN``) or a
    language name in any indexed language (``french``, ``Français``) is read as its code too;
    the configuration takes codes only and hints at the code."""
    text = value.strip().lower()
    if text in ("off", "auto") or text in LANGUAGE_CODES:
        return text
    code = resolve(text)
    if names and code is not None:
        return code
    hint = f"; did you mean {code}?" if code else ""
    raise ValueError(
        "must be off, auto or a two-letter ISO 639-1 code the language model knows (en, it, "
        f"de, zh, ...){hint}"
    )


class Settings(BaseSettings):
    """Every ``GUARD_*`` setting of the proxy (meanings: ``SETTINGS_HELP`` in
    :mod:`proxy.cli.explain`, shown by ``coherence-guard config --explain``)."""

    model_config = _ENV

    upstream_url: str = "http://127.0.0.1:8000"
    host: str = "0.0.0.0"
    port: int = Field(default=8080, ge=1, le=65535)
    workers: int = Field(default=1, ge=1)

    mode: Literal["enforce", "monitor", "off", "heal"] = "enforce"
    allow_client_override: bool = False
    abort_finish_reason: Literal["content_filter", "length", "stop", "repetition"] = (
        "content_filter"
    )
    trim_on_abort: bool = True
    #: The event that ends an aborted (or length-stopped, when healed) Responses stream:
    #: ``completed`` = vLLM's own early-stop ending (``response.completed`` with ``status:
    #: "incomplete"``), which the openai SDK's stream helper and openai-agents accept;
    #: ``incomplete`` = a ``response.incomplete`` event, as OpenAI's API ends one.
    responses_abort_event: Literal["completed", "incomplete"] = "completed"

    max_tokens_default: int = Field(default=8192, ge=1)
    max_tokens_cap: int = Field(default=32768, ge=1)
    max_tokens_policy: Literal["clamp", "reject"] = "clamp"
    language: str = "off"
    sampling_defaults: Annotated[dict[str, dict[str, Any]], NoDecode] = Field(default_factory=dict)
    request_usage: bool = True

    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1)
    connect_timeout: float = Field(default=5.0, gt=0)
    read_timeout: float = Field(default=600.0, gt=0)
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    log_text: bool = False
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"

    metrics_max_models: int = Field(default=20, ge=1)
    upstream_metrics_interval: float = Field(default=60.0, ge=0)

    # --- upstream connection (one configuration for every route's client) ---
    #: Bearer key the proxy sends to the engine; unset = the client's Authorization is passed on.
    upstream_api_key: str | None = None
    #: Verify the engine's TLS certificate (https upstreams).
    upstream_tls_verify: bool = True
    #: PEM bundle of CAs trusted for the engine; unset = the system store (certifi-free, ssl's).
    upstream_ca_bundle: str | None = None
    #: Client certificate (PEM, may hold the key) and key for mutual TLS with the engine.
    upstream_client_cert: str | None = None
    upstream_client_key: str | None = None
    #: Seconds a write of the request to the engine may take.
    write_timeout: float = Field(default=30.0, gt=0)
    #: Connections kept to the engine per worker.
    upstream_max_connections: int = Field(default=1024, ge=1)

    # --- routing and bounds ---
    #: Engine paths that generate text but are not guarded: relay them (with a warning at
    #: start-up) or answer 403.
    unguarded_routes: Literal["pass", "reject"] = "pass"
    #: Largest single SSE event accepted from the engine (bytes); a larger one ends the stream
    #: with an error instead of growing without bound.
    max_event_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    #: A client that accepts no bytes for this many seconds is dropped and the upstream closed.
    client_write_timeout: float = Field(default=30.0, gt=0)
    #: Overall limit on one request, seconds (0 = none).
    request_deadline: float = Field(default=0.0, ge=0)
    #: Seconds an aborted answer may wait for the engine's count of its prompt (POST /tokenize),
    #: asked only where the engine sent none before the abort; 0 = never asked (left out).
    prompt_count_timeout: float = Field(default=1.0, ge=0)

    # --- operability ---
    log_format: Literal["text", "json"] = "text"
    access_log: bool = False
    #: Keys allowed to send x-guard-mode (when GUARD_ALLOW_CLIENT_OVERRIDE); empty = every key.
    override_api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Require an API key (one of GUARD_API_KEYS or GUARD_METRICS_API_KEYS) on /metrics*.
    protect_metrics: bool = False
    metrics_api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Where the expected language of an answer comes from when GUARD_LANGUAGE does not inject
    #: one: ``prompt`` = detected from the request's own text, ``off`` = none.
    expect_language: Literal["prompt", "off"] = "prompt"
    #: Seconds between checks that the engine answers (its /health and /v1/models); the model
    #: list bounds the metrics' model label. 0 turns the checks off.
    upstream_check_interval: float = Field(default=30.0, ge=0)
    #: Ask the engine for each sampled token's log-probability on guarded chat/completions
    #: requests (the detector's certainty signal); removed from what a client that did not ask
    #: for logprobs receives.
    request_logprobs: bool = False

    # --- heal mode ---
    #: Continuations one choice may get before it ends as enforce ends it.
    heal_max_attempts: int = Field(default=2, ge=0, le=8)
    #: Text chunks held back from the client in heal mode (0 = none).
    heal_holdback_tokens: int = Field(default=64, ge=0, le=4096)
    #: Text chunks held back while a continuation is relayed: it spans the detection delay of
    #: gibberish and salad, so a continuation that degenerates is cut before the client sees it.
    heal_continuation_holdback_tokens: int = Field(default=160, ge=0, le=4096)
    #: Share of a continuation's prose words unknown to its language's word list above which
    #: (and above the kept answer's own share) it ends as an abort, not a heal (1 = off).
    heal_max_unknown_share: float = Field(default=0.2, ge=0, le=1)
    heal_repetition_penalty_step: float = Field(default=0.1, ge=0, le=1)
    heal_frequency_penalty_step: float = Field(default=0.3, ge=0, le=2)
    heal_presence_penalty_step: float = Field(default=0.0, ge=0, le=2)
    heal_temperature_step: float = Field(default=0.3, ge=0, le=2)
    heal_repetition_detection: bool = True

    # --- retries of aborted requests ---
    #: A request the guard aborted as a loop and that comes again unchanged within
    #: GUARD_RETRY_WINDOW seconds: heal = answer it in heal mode (structured answers: defend);
    #: defend = enforce with the repetition defences of heal's first continuation; off = as any.
    retry_after_abort: Literal["heal", "defend", "off"] = "heal"
    retry_window: float = Field(default=120.0, ge=0)
    #: Aborted requests remembered per worker and route (16-byte digests, never the text).
    retry_memory: int = Field(default=1024, ge=1, le=1_000_000)

    # --- validation -------------------------------------------------------------------------

    @field_validator(*LIST_FIELDS, mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator(*LIST_FIELDS)
    @classmethod
    def _keys(cls, keys: list[str]) -> list[str]:
        for key in keys:
            if not key or any(c.isspace() or not c.isprintable() for c in key):
                raise ValueError("keys must be non-empty and contain no spaces")
        return keys

    @field_validator("sampling_defaults", mode="before")
    @classmethod
    def _sampling_json(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        if not value.strip():
            return {}
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"not valid JSON ({exc.msg} at character {exc.pos}); write a JSON object like "
                '{"qwen*": {"repetition_penalty": 1.05}}'
            ) from None

    @field_validator(
        "upstream_api_key",
        "upstream_ca_bundle",
        "upstream_client_cert",
        "upstream_client_key",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        # ``GUARD_UPSTREAM_API_KEY=`` (as .env.example writes an unset value) means unset, not
        # a key or path that is the empty string.
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("upstream_url")
    @classmethod
    def _upstream_url(cls, value: str) -> str:
        return _check_upstream_url(value)

    @field_validator("language")
    @classmethod
    def _language(cls, value: str) -> str:
        return check_language(value)

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be an address to listen on, e.g. 0.0.0.0 or 127.0.0.1")
        return value.strip()

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        """Combinations that are each valid alone but cannot be what the operator meant."""
        problems = []
        # Only a default the operator set: with the cap alone lowered, the default is the cap
        # (rewriting takes the smaller), which is what "limit everything to N" means.
        if "max_tokens_default" in self.model_fields_set and (
            self.max_tokens_default > self.max_tokens_cap
        ):
            problems.append(
                f"GUARD_MAX_TOKENS_DEFAULT={self.max_tokens_default} is above "
                f"GUARD_MAX_TOKENS_CAP={self.max_tokens_cap}: the default must be at most the cap"
            )
        if self.upstream_client_key and not self.upstream_client_cert:
            problems.append(
                "GUARD_UPSTREAM_CLIENT_KEY is set without GUARD_UPSTREAM_CLIENT_CERT: set the "
                "certificate too (the key alone is never sent)"
            )
        for name in ("upstream_ca_bundle", "upstream_client_cert", "upstream_client_key"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                problems.append(f"GUARD_{name.upper()}={path!r}: no such file")
        if self.upstream_ca_bundle and not self.upstream_tls_verify:
            problems.append(
                "GUARD_UPSTREAM_CA_BUNDLE is set but GUARD_UPSTREAM_TLS_VERIFY=false turns "
                "verification off: drop one of them"
            )
        # Override keys are accepted as API keys too (proxy/server/middleware.py): no subset check.
        if self.override_api_keys and not self.allow_client_override:
            problems.append(
                "GUARD_OVERRIDE_API_KEYS is set but GUARD_ALLOW_CLIENT_OVERRIDE=false: no client "
                "may override the mode; set GUARD_ALLOW_CLIENT_OVERRIDE=true or drop the keys"
            )
        if self.metrics_api_keys and not self.protect_metrics:
            problems.append(
                "GUARD_METRICS_API_KEYS is set but GUARD_PROTECT_METRICS=false leaves the "
                "metrics open to everyone: set GUARD_PROTECT_METRICS=true or drop the keys"
            )
        if self.protect_metrics and not (self.api_keys or self.metrics_api_keys):
            problems.append(
                "GUARD_PROTECT_METRICS=true but neither GUARD_API_KEYS nor "
                "GUARD_METRICS_API_KEYS holds a key: nobody could read the metrics"
            )
        if "" in self.sampling_defaults:
            problems.append("GUARD_SAMPLING_DEFAULTS: a model name (key) is empty")
        if problems:
            raise ValueError(_CROSS_FIELD + " | ".join(problems))
        return self


_CROSS_FIELD = "cross-field: "


class _DetectorSettingsBase(BaseSettings):
    # The configuration must be on the base class: assigned to a model after it is built, it
    # is not applied, and a .env holding proxy settings was "extra inputs" to the detector.
    model_config = _ENV


def _detector_settings_model() -> type[BaseSettings]:
    fields: dict[str, Any] = {
        f.name: (f.type, f.default) for f in dataclasses.fields(DetectorConfig)
    }
    return create_model("DetectorSettings", __base__=_DetectorSettingsBase, **fields)


_DetectorSettings = _detector_settings_model()


def _shown(field: str, value: Any) -> str:
    if field in SECRET_FIELDS:
        return "(value hidden)"
    if field == "upstream_url" and isinstance(value, str):
        value = mask_url(value)
    if isinstance(value, str):
        return repr(value)
    return repr(json.dumps(value, default=str))


def _message(msg: str) -> str:
    msg = msg.removeprefix("Value error, ")
    return msg[:1].lower() + msg[1:]


def _problems(exc: ValidationError) -> list[str]:
    """One line per error: ``GUARD_X='value': what is wrong and what is allowed``."""
    problems: list[str] = []
    for err in exc.errors():
        loc = err["loc"]
        if not loc:  # a model validator: its message names the variables itself
            text = err["msg"].removeprefix("Value error, ").removeprefix(_CROSS_FIELD)
            problems += text.split(" | ")
            continue
        msg = _message(err["msg"])
        field = str(loc[0])
        name = "GUARD_" + field.upper()
        if len(loc) > 1:  # inside a list or object: say where, show the part
            where = "".join(f"[{p!r}]" for p in loc[1:])
            shown = "(value hidden)" if field in SECRET_FIELDS else repr(err.get("input"))
            problems.append(f"{name}{where}={shown}: {msg}")
        elif err["type"] == "missing":
            problems.append(f"{name}: {msg}")
        else:
            problems.append(f"{name}={_shown(field, err.get('input'))}: {msg}")
    return problems


def _settings_error(exc: SettingsError) -> ConfigError:
    found = _SETTINGS_ERROR_FIELD.search(str(exc))
    name = "GUARD_" + found.group(1).upper() if found else "a GUARD_* variable"
    return ConfigError([f"{name}: could not be decoded ({exc})"])


def load_settings(**overrides: Any) -> Settings:
    """Read the environment (overrides win), raising ConfigError that names the variable."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_problems(exc)) from None
    except SettingsError as exc:
        raise _settings_error(exc) from None


def load_detector_config(**overrides: Any) -> DetectorConfig:
    try:
        values = _DetectorSettings(**overrides).model_dump()
    except ValidationError as exc:
        raise ConfigError(_problems(exc)) from None
    except SettingsError as exc:
        raise _settings_error(exc) from None
    return DetectorConfig(**values)


def known_variables() -> frozenset[str]:
    """Every ``GUARD_*`` name the proxy reads (settings and detector)."""
    names = {"GUARD_" + name.upper() for name in Settings.model_fields}
    names |= {"GUARD_" + f.name.upper() for f in dataclasses.fields(DetectorConfig)}
    return frozenset(names)


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """A warning for each ``GUARD_*`` name in the environment the proxy does not read, with the
    nearest known name when there is one: a typo (``GUARD_MOD``) is otherwise silently ignored."""
    environ = os.environ if environ is None else environ
    known = known_variables()
    out = []
    for name in sorted(n for n in environ if n.startswith("GUARD_") and n not in known):
        if name in _NOT_OURS:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        hint = f" (did you mean {close[0]}?)" if close else ""
        out.append(f"{name} is not a setting{hint}; ignored")
    return out


#: GUARD_* variables other programs read (docker-compose.yml), not the proxy.
_NOT_OURS = frozenset({"GUARD_PUBLISH_PORT"})
