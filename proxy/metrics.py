"""Prometheus metrics: a quality registry and an infrastructure registry, never mixed.

NOTE: stand-in. Method names and signatures are the contract the relay calls; the collectors
behind them are built in the observability work (issue 4).
"""

from __future__ import annotations

from proxy.records import GenerationRecord


class Metrics:
    def render_quality(self) -> tuple[bytes, str]:
        """Exposition of the quality registry for ``GET /metrics/quality``: (body, content type)."""
        return b"", "text/plain; version=0.0.4; charset=utf-8"

    def render_infra(self) -> tuple[bytes, str]:
        """Exposition of the infrastructure registry for ``GET /metrics``."""
        return b"", "text/plain; version=0.0.4; charset=utf-8"

    def record_generation(self, record: GenerationRecord) -> None:
        """Once per request, when its stream ends (any outcome)."""

    def max_tokens_rewritten(self, model: str, action: str) -> None:
        """action in defaulted | clamped | rejected."""

    def language_constraint(self, model: str, language: str) -> None:
        """A language instruction was injected into the request."""

    def request_finished(self, route: str, status: int, seconds: float) -> None:
        """Infra: every HTTP request through the proxy; route is a small fixed set."""

    def time_to_first_token(self, seconds: float) -> None:
        """Infra: from request received to first content byte relayed to the client."""

    def stream_opened(self) -> None:
        """Infra: in-flight streams gauge up."""

    def stream_closed(self) -> None:
        """Infra: in-flight streams gauge down."""

    def upstream_error(self, kind: str) -> None:
        """Infra: kind in connect | timeout | status | protocol | disconnect."""
