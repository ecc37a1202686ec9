"""Configuration is validated at start-up: each problem is one line naming the variable, the
value and what is allowed, and values that would silently mean something else are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.settings import (
    LANGUAGE_CODES,
    ConfigError,
    load_detector_config,
    load_settings,
    unknown_variables,
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No GUARD_* from the caller's environment and no stray .env."""
    import os

    for name in list(os.environ):
        if name.startswith("GUARD_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def problems_for(monkeypatch: pytest.MonkeyPatch, **env: str) -> list[str]:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "\n" not in str(info.value)
    return info.value.problems


def test_bad_mode_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GUARD_MODE", "sometimes")
    with pytest.raises(ConfigError, match="GUARD_MODE"):
        load_settings()


def test_detector_fields_are_read_from_guard_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import fields

    name = fields(load_detector_config())[0].name
    monkeypatch.setenv("GUARD_" + name.upper(), "not-a-number")
    with pytest.raises(ConfigError, match="GUARD_" + name.upper()):
        load_detector_config()


@pytest.mark.parametrize(
    ("raw", "keys"),
    [
        ("key1", ["key1"]),
        ("key1,key2", ["key1", "key2"]),
        (" key1 , key2 ,", ["key1", "key2"]),
        ('["key1","key2"]', ["key1", "key2"]),
        ("[]", []),
        ("", []),
    ],
    ids=["one", "comma", "comma-spaces", "json", "json-empty", "empty"],
)
@pytest.mark.parametrize("field", ["api_keys", "override_api_keys", "metrics_api_keys"])
def test_key_lists_accept_json_or_commas(
    monkeypatch: pytest.MonkeyPatch, field: str, raw: str, keys: list[str]
) -> None:
    monkeypatch.setenv("GUARD_" + field.upper(), raw)
    if field == "override_api_keys":
        monkeypatch.setenv("GUARD_ALLOW_CLIENT_OVERRIDE", "true")
    if field == "metrics_api_keys":
        monkeypatch.setenv("GUARD_PROTECT_METRICS", "true")
        monkeypatch.setenv("GUARD_API_KEYS", "admin")
    assert getattr(load_settings(), field) == keys


def test_a_broken_json_key_list_is_one_line_and_hides_the_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (problem,) = problems_for(monkeypatch, GUARD_API_KEYS='["sk-secret-1", "sk-secret-2"')
    assert problem.startswith("GUARD_API_KEYS=(value hidden): not a valid JSON list")
    assert "k1,k2" in problem  # says what is allowed
    assert "sk-secret" not in problem


def test_keys_with_spaces_are_refused_without_echoing_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (problem,) = problems_for(monkeypatch, GUARD_API_KEYS='["sk secret"]')
    assert "GUARD_API_KEYS" in problem and "no spaces" in problem
    assert "secret" not in problem


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        ("vllm:8000", "did you mean http://vllm:8000?"),
        ("localhost", "did you mean http://localhost?"),
        ("ftp://vllm:8000", "not ftp://"),
        ("http://", "has no host"),
        ("http://vllm:99999", "invalid port"),
        ("http://vllm:8000/?x=1", "query"),
    ],
)
def test_upstream_url_must_be_an_http_base_url(
    monkeypatch: pytest.MonkeyPatch, url: str, hint: str
) -> None:
    (problem,) = problems_for(monkeypatch, GUARD_UPSTREAM_URL=url)
    assert problem.startswith(f"GUARD_UPSTREAM_URL={url!r}: ")
    assert hint in problem


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        ("http://vllm:8000", "http://vllm:8000"),
        ("https://engine.internal", "https://engine.internal"),
        ("http://10.0.0.5:8000/prefix/", "http://10.0.0.5:8000/prefix/"),
        ("http://vllm:8000/v1", "http://vllm:8000"),  # the OpenAI base_url way: its root
        ("https://gw.example/vllm/v1/", "https://gw.example/vllm"),
    ],
)
def test_good_upstream_urls_are_kept(monkeypatch: pytest.MonkeyPatch, url: str, kept: str) -> None:
    monkeypatch.setenv("GUARD_UPSTREAM_URL", url)
    assert load_settings().upstream_url == kept


def test_upstream_url_password_is_masked_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    (problem,) = problems_for(monkeypatch, GUARD_UPSTREAM_URL="http://user:hunter2@vllm:99999")
    assert "hunter2" not in problem and "user:***@vllm" in problem


def test_log_level_lists_what_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    (problem,) = problems_for(monkeypatch, GUARD_LOG_LEVEL="verbose")
    assert problem.startswith("GUARD_LOG_LEVEL='verbose': ")
    for level in ("debug", "info", "warning", "error", "critical"):
        assert level in problem
    monkeypatch.setenv("GUARD_LOG_LEVEL", "WARNING")
    assert load_settings().log_level == "warning"


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("english", "did you mean en?"),
        ("Deutsch", "did you mean de?"),
        ("en-US", "did you mean en?"),
        ("pt_BR", "did you mean pt?"),
        ("klingon", ""),
        ("xx", ""),
    ],
)
def test_language_must_be_a_code_the_model_knows(
    monkeypatch: pytest.MonkeyPatch, value: str, hint: str
) -> None:
    (problem,) = problems_for(monkeypatch, GUARD_LANGUAGE=value)
    assert problem.startswith(f"GUARD_LANGUAGE={value!r}: must be off, auto or a two-letter")
    assert hint in problem
    if not hint:
        assert "did you mean" not in problem


@pytest.mark.parametrize(("value", "kept"), [("EN", "en"), ("auto", "auto"), (" off ", "off")])
def test_language_is_normalised(monkeypatch: pytest.MonkeyPatch, value: str, kept: str) -> None:
    monkeypatch.setenv("GUARD_LANGUAGE", value)
    assert load_settings().language == kept


def test_language_codes_are_the_language_models_own() -> None:
    """The accepted codes are exactly the two-letter labels of the shipped lid.176 model: a
    code it cannot answer with would make every answer look like drift."""
    from proxy.detect.language import _model

    codes: set[str] = set()
    # fastText leaves out labels whose probability underflows: ask with texts in many scripts.
    texts = ("some text", "hello world", "ciao mondo", "привет мир", "你好世界", "こんにちは")
    for text in (*texts, "مرحبا", "Γειά σου", "שלום", "नमस्ते", "a", "zzz"):
        labels, _ = _model().predict(text, -1, 0.0)
        codes |= {str(label).removeprefix("__label__") for label in labels}
    assert len(codes) == 176  # lid.176
    assert {c for c in codes if len(c) == 2} == LANGUAGE_CODES


def test_sampling_defaults_bad_json_and_bad_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    (problem,) = problems_for(monkeypatch, GUARD_SAMPLING_DEFAULTS="{qwen: 1}")
    assert problem.startswith("GUARD_SAMPLING_DEFAULTS='{qwen: 1}': not valid JSON")
    (problem,) = problems_for(monkeypatch, GUARD_SAMPLING_DEFAULTS='{"qwen*": 1.05}')
    assert problem.startswith("GUARD_SAMPLING_DEFAULTS['qwen*']=1.05: ")
    assert "dictionary" in problem


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"GUARD_MAX_TOKENS_DEFAULT": "40000"},
            "GUARD_MAX_TOKENS_DEFAULT=40000 is above GUARD_MAX_TOKENS_CAP=32768",
        ),
        (
            {"GUARD_UPSTREAM_CLIENT_KEY": "/etc/hostname"},
            "GUARD_UPSTREAM_CLIENT_KEY is set without GUARD_UPSTREAM_CLIENT_CERT",
        ),
        ({"GUARD_UPSTREAM_CA_BUNDLE": "/no/such/ca.pem"}, "'/no/such/ca.pem': no such file"),
        (
            {"GUARD_UPSTREAM_CA_BUNDLE": "/etc/hostname", "GUARD_UPSTREAM_TLS_VERIFY": "false"},
            "GUARD_UPSTREAM_TLS_VERIFY=false turns verification off",
        ),
        ({"GUARD_OVERRIDE_API_KEYS": "a"}, "GUARD_ALLOW_CLIENT_OVERRIDE=false"),
        ({"GUARD_METRICS_API_KEYS": "scraper"}, "GUARD_PROTECT_METRICS=false"),
        ({"GUARD_PROTECT_METRICS": "true"}, "nobody could read the metrics"),
    ],
    ids=[
        "default-above-cap",
        "key-without-cert",
        "missing-file",
        "ca-without-verify",
        "override-keys-unused",
        "metrics-keys-unused",
        "metrics-unreadable",
    ],
)
def test_cross_field_problems(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    problems = problems_for(monkeypatch, **env)
    assert any(expected in p for p in problems), problems


def test_a_lowered_cap_alone_is_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a default the operator set above the cap is a contradiction; with the cap alone
    lowered the default request limit is the cap."""
    monkeypatch.setenv("GUARD_MAX_TOKENS_CAP", "1000")
    assert load_settings().max_tokens_cap == 1000


def test_several_problems_are_all_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    problems = problems_for(
        monkeypatch, GUARD_LOG_LEVEL="loud", GUARD_LANGUAGE="english", GUARD_PORT="0"
    )
    assert [p.split("=")[0] for p in problems] == [
        "GUARD_PORT",
        "GUARD_LANGUAGE",
        "GUARD_LOG_LEVEL",
    ]


def test_empty_optional_values_mean_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """``.env.example`` writes unset values as ``GUARD_UPSTREAM_API_KEY=``."""
    for name in ("API_KEY", "CA_BUNDLE", "CLIENT_CERT", "CLIENT_KEY"):
        monkeypatch.setenv(f"GUARD_UPSTREAM_{name}", "")
    settings = load_settings()
    assert settings.upstream_api_key is None and settings.upstream_ca_bundle is None


def test_a_settings_source_error_names_the_variable() -> None:
    """pydantic-settings raises SettingsError (not ValidationError) when it cannot decode a
    value before validation; it becomes the same one-line ConfigError."""
    from pydantic_settings import SettingsError

    from proxy.settings import _settings_error

    exc = SettingsError('error parsing value for field "sampling_defaults" from source "X"')
    assert _settings_error(exc).problems[0].startswith("GUARD_SAMPLING_DEFAULTS: ")


def test_unknown_guard_variables_are_named_with_the_nearest_setting() -> None:
    warnings = unknown_variables(
        {"GUARD_MOD": "monitor", "GUARD_MODE": "off", "GUARD_PUBLISH_PORT": "1", "PATH": "/"}
    )
    assert warnings == ["GUARD_MOD is not a setting (did you mean GUARD_MODE?); ignored"]


def test_a_dotenv_with_proxy_settings_does_not_upset_the_detector(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One .env holds proxy and detector variables; each reader takes its own."""
    (tmp_path / ".env").write_text(
        "GUARD_UPSTREAM_URL=http://vllm:8000\nGUARD_DIVERSITY_MIN_RATIO=0.5\nOTHER=1\n"
    )
    assert load_settings().upstream_url == "http://vllm:8000"
    assert load_detector_config().diversity_min_ratio == 0.5
