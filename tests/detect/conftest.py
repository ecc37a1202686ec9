"""Helpers shared by the detector tests."""

from __future__ import annotations

import dataclasses
from typing import Any

from proxy.detect import Detector, DetectorConfig, Summary
from tests.detect.texts import as_deltas


def stream(
    text: str,
    config: DetectorConfig | None = None,
    *,
    expected_language: str | None = None,
    structured: bool = False,
    logprobs: list[Any] | None = None,
) -> Summary:
    """Feed ``text`` in token-sized deltas, stop at the first verdict, return the summary."""
    detector = Detector(config, expected_language=expected_language, structured=structured)
    for delta in as_deltas(text):
        if detector.feed(delta, logprobs=logprobs) is not None:
            break
    return detector.finish()


def only(*signals: str) -> DetectorConfig:
    """The default configuration with every on/off switch off but ``signals``'."""
    return DetectorConfig(
        **{
            f.name: False
            for f in dataclasses.fields(DetectorConfig)
            if f.type in (bool, "bool") and f.name not in signals
        }
    )
