"""Coherence Guard: a streaming proxy that stops degenerate LLM generations at the engine."""

__version__ = "0.1.0"
