"""Entropy collapse from the upstream's ``top_logprobs``.

A model stuck in a loop becomes certain: the entropy of its next-token distribution falls towards
zero and stays there. The distribution is only known through the top-k alternatives, so the
entropy is that of the top-k renormalised plus one bucket for the remaining mass: a lower bound
that is exact when k covers the mass, and good enough to see a collapse.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any


def token_entropy(entry: Any) -> tuple[float, float] | None:
    """(entropy in nats, chosen-token logprob) of one ``logprobs.content`` entry, or None."""
    if not isinstance(entry, dict):
        return None
    chosen = entry.get("logprob")
    top = entry.get("top_logprobs")
    if not isinstance(chosen, int | float):
        return None
    probs: list[float] = []
    if isinstance(top, list):
        for alt in top:
            lp = alt.get("logprob") if isinstance(alt, dict) else None
            if isinstance(lp, int | float) and lp > -50:
                probs.append(math.exp(lp))
    if not probs:
        probs = [math.exp(max(chosen, -50.0))]
    mass = sum(probs)
    rest = max(0.0, 1.0 - mass)
    entropy = -sum(p * math.log(p) for p in probs if p > 0)
    if rest > 1e-9:
        entropy -= rest * math.log(rest)
    return (max(0.0, entropy), float(chosen))


class EntropyWindow:
    """Rolling mean entropy over the last ``size`` tokens that carried logprobs (O(1) per token)."""

    __slots__ = ("_sum", "_values", "size")

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._values: deque[float] = deque()
        self._sum = 0.0

    def add(self, entropy: float) -> None:
        self._values.append(entropy)
        self._sum += entropy
        if len(self._values) > self.size:
            self._sum -= self._values.popleft()

    @property
    def full(self) -> bool:
        return len(self._values) >= self.size

    @property
    def mean(self) -> float | None:
        if not self._values:
            return None
        return max(0.0, self._sum / len(self._values))
