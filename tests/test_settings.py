"""Configuration is validated at start-up and names the bad variable."""

import pytest

from proxy.settings import ConfigError, load_detector_config, load_settings


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
