"""Configuration: environment variables with the ``GUARD_`` prefix (and an optional ``.env``).

Read once, at start-up, into frozen objects; the hot path never looks at the environment.
Detector knobs are not listed here by hand: every field of :class:`DetectorConfig` becomes a
``GUARD_<FIELD>`` variable through :func:`load_detector_config`, so the detector owns its knobs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import Field, ValidationError, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict

from proxy.detect import DetectorConfig

_ENV = SettingsConfigDict(
    env_prefix="GUARD_", env_file=".env", env_file_encoding="utf-8", extra="ignore", frozen=True
)


class ConfigError(Exception):
    """A configuration value is invalid; the message names the environment variable."""


class Settings(BaseSettings):
    model_config = _ENV

    upstream_url: str = "http://127.0.0.1:8000"
    host: str = "0.0.0.0"
    port: int = Field(default=8080, ge=1, le=65535)
    workers: int = Field(default=1, ge=1)

    mode: Literal["enforce", "monitor", "off"] = "enforce"
    allow_client_override: bool = False
    abort_finish_reason: Literal["content_filter", "length", "stop", "repetition"] = (
        "content_filter"
    )
    trim_on_abort: bool = True

    max_tokens_default: int = Field(default=8192, ge=1)
    max_tokens_cap: int = Field(default=32768, ge=1)
    max_tokens_policy: Literal["clamp", "reject"] = "clamp"
    language: str = "off"
    sampling_defaults: dict[str, dict[str, Any]] = Field(default_factory=dict)
    request_usage: bool = True

    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1)
    connect_timeout: float = Field(default=5.0, gt=0)
    read_timeout: float = Field(default=600.0, gt=0)
    api_keys: list[str] = Field(default_factory=list)
    log_text: bool = False
    log_level: str = "info"

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

    # --- operability ---
    log_format: Literal["text", "json"] = "text"
    access_log: bool = False
    #: Keys allowed to send x-guard-mode (when GUARD_ALLOW_CLIENT_OVERRIDE); empty = every key.
    override_api_keys: list[str] = Field(default_factory=list)
    #: Require an API key (one of GUARD_API_KEYS or GUARD_METRICS_API_KEYS) on /metrics*.
    protect_metrics: bool = False
    metrics_api_keys: list[str] = Field(default_factory=list)
    #: Where the expected language of an answer comes from when GUARD_LANGUAGE does not inject
    #: one: ``prompt`` = detected from the request's own text, ``off`` = none.
    expect_language: Literal["prompt", "off"] = "prompt"


def _detector_settings_model() -> type[BaseSettings]:
    fields: dict[str, Any] = {
        f.name: (f.type, f.default) for f in dataclasses.fields(DetectorConfig)
    }
    return create_model("DetectorSettings", __base__=BaseSettings, **fields)


_DetectorSettings = _detector_settings_model()
_DetectorSettings.model_config = _ENV


def _as_config_error(exc: ValidationError) -> ConfigError:
    problems = []
    for err in exc.errors():
        name = "GUARD_" + "_".join(str(p) for p in err["loc"]).upper()
        problems.append(f"{name}: {err['msg']} (got {err.get('input')!r})")
    return ConfigError("invalid configuration: " + "; ".join(problems))


def load_settings(**overrides: Any) -> Settings:
    """Read the environment (overrides win), raising ConfigError that names the variable."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise _as_config_error(exc) from None


def load_detector_config(**overrides: Any) -> DetectorConfig:
    try:
        values = _DetectorSettings(**overrides).model_dump()
    except ValidationError as exc:
        raise _as_config_error(exc) from None
    return DetectorConfig(**values)
