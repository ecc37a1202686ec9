"""The statistics of ``coherence-guard calibrate``: pure functions, no I/O.

One calibration answer is an :class:`Observation`: how many tokens it ran, and at which token the
detector first judged it degenerate (``None``: it stayed coherent to its end). Every answer is
watched from its first token to its end or to ``max_tokens``, so nothing is unknown below
``max_tokens``: the share still coherent after ``k`` tokens is exact, a plain empirical survival
function (an answer that stopped coherent at token 80 is coherent at every k; no censoring
correction is needed below the horizon, and the curve says nothing beyond it).

From the degeneration positions come the recommendations:

* **max_tokens cap**: the ``quantile`` of the positions minus ``margin`` tokens. Below it, few of
  the measured loops had begun; above it, generation is mostly spent on loops. The share of
  coherent answers that were longer than the cap is reported next to it, because a cap cuts those
  too; beyond :data:`CAP_BUDGET` of them no cap is recommended (no cap separates the loops from
  the healthy answers).
* **sampling setting**: the (repetition_penalty, temperature) with the fewest degenerate answers;
  on a tie the mildest (lowest penalty, then lowest temperature), since every penalty also bends
  healthy text.

The same cap can come from production: the proxy's ``guard_abort_position_tokens`` histogram
gives cumulative bucket counts, read with :func:`histogram_quantile` (Prometheus's own linear
interpolation inside a bucket) and :func:`histogram_survival`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Observation:
    """One answer: tokens generated and the token of its first degeneration, if any."""

    tokens: int
    degenerate_at: int | None = None
    signal: str | None = None

    @property
    def degenerate(self) -> bool:
        return self.degenerate_at is not None


@dataclass(frozen=True, slots=True, order=True)
class Setting:
    """A sampling setting of the matrix; ordered mildest first."""

    repetition_penalty: float
    temperature: float

    def label(self) -> str:
        return f"repetition_penalty={self.repetition_penalty:g} temperature={self.temperature:g}"


def positions(observations: Iterable[Observation]) -> list[int]:
    """The degeneration positions, sorted."""
    return sorted(o.degenerate_at for o in observations if o.degenerate_at is not None)


def survival_curve(observations: Sequence[Observation], horizon: int) -> list[tuple[int, float]]:
    """Share of answers still coherent after ``k`` tokens, as the corners of a step function.

    Starts at ``(0, 1.0)``, drops at each degeneration position (several answers degenerating at
    the same token make one step) and ends at ``(horizon, share)``. Empty input: ``[]``.
    """
    n = len(observations)
    if n == 0:
        return []
    curve = [(0, 1.0)]
    alive = n
    points = positions(observations)
    i = 0
    while i < len(points):
        k = points[i]
        while i < len(points) and points[i] == k:
            alive -= 1
            i += 1
        if k <= horizon:
            curve.append((k, alive / n))
    last = curve[-1][1]
    if curve[-1][0] < horizon:
        curve.append((horizon, last))
    return curve


def survival_at(curve: Sequence[tuple[int, float]], k: int) -> float | None:
    """The curve's value after ``k`` tokens (``None`` beyond its horizon or for no data)."""
    if not curve or k > curve[-1][0]:
        return None
    value = 1.0
    for position, share in curve:
        if position > k:
            break
        value = share
    return value


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile with linear interpolation between order statistics (numpy's default,
    Hyndman-Fan type 7). ``values`` need not be sorted; it must not be empty."""
    if not values:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    ordered = sorted(values)
    h = (len(ordered) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (h - lo) * (ordered[hi] - ordered[lo])


#: The largest share of coherent answers a recommended cap may cut. A cap that cuts more breaks
#: the answers the guard is there to protect: no cap is recommended then (the sampling setting
#: or heal mode deal with the loops instead).
CAP_BUDGET = 0.01


def recommend_cap(points: Sequence[float], q: float, margin: int) -> int | None:
    """``quantile(points, q) - margin``, at least 1; ``None`` when nothing degenerated."""
    if not points:
        return None
    return max(1, math.floor(quantile(points, q)) - margin)


def truncated_share(observations: Sequence[Observation], cap: int) -> float:
    """Share of the coherent answers that ran longer than ``cap`` (a cap would cut them)."""
    coherent = [o for o in observations if not o.degenerate]
    if not coherent:
        return 0.0
    return sum(o.tokens > cap for o in coherent) / len(coherent)


def degeneration_rate(observations: Sequence[Observation]) -> float:
    return sum(o.degenerate for o in observations) / len(observations) if observations else 0.0


def best_setting(by_setting: Mapping[Setting, Sequence[Observation]]) -> Setting | None:
    """The setting with the lowest degeneration rate; the mildest among equals."""
    measured = [s for s, obs in by_setting.items() if obs]
    if not measured:
        return None
    return min(measured, key=lambda s: (degeneration_rate(by_setting[s]), s))


def signal_counts(observations: Iterable[Observation]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for o in observations:
        if o.signal is not None:
            counts[o.signal] = counts.get(o.signal, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


# -- from Prometheus histograms ------------------------------------------------------------------


def histogram_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """Prometheus's ``histogram_quantile`` on cumulative ``(le, count)`` buckets.

    Linear interpolation inside the bucket that holds the rank, the first bucket starting at 0;
    a rank in the ``+Inf`` bucket answers the largest finite bound. ``None`` when empty.
    """
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    total = ordered[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank and count > lower_count:
            if math.isinf(bound):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def histogram_survival(
    abort_buckets: Sequence[tuple[float, float]], generations: float
) -> list[tuple[float, float]]:
    """Share of ``generations`` not yet aborted at each finite bucket bound."""
    if generations <= 0:
        return []
    return [
        (bound, max(0.0, 1.0 - count / generations))
        for bound, count in sorted(abort_buckets)
        if not math.isinf(bound)
    ]


def histogram_count_le(buckets: Sequence[tuple[float, float]], x: float) -> float:
    """How many observations of the cumulative ``(le, count)`` buckets are ``<= x``, by linear
    interpolation inside the bucket that holds ``x`` (the first bucket starting at 0), as
    ``histogram_quantile`` reads them."""
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in sorted(buckets):
        if x <= bound:
            if math.isinf(bound):
                return lower_count
            return lower_count + (count - lower_count) * (x - lower_bound) / (bound - lower_bound)
        lower_bound, lower_count = bound, count
    return lower_count


def healthy_buckets(
    completions: Sequence[tuple[float, float]], aborts: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    """The completions that were not aborted, bucket by bucket: every generation's length
    (``guard_completion_tokens``) less the aborted ones, whose length is where they were cut
    (``guard_abort_position_tokens``, the same bucket bounds). An answer only observed as
    degenerate (monitor mode) ran on past its verdict: it stays counted above that bucket, so
    the healthy share above a cap is over-, never under-estimated.

    Each bucket's difference is rounded to whole answers: ``increase()`` extrapolates every
    series to the window's edges by its own factor (a bucket born at 0 differs from one born
    at 3), so two estimates of the same aborted answers differ by a fraction, and that
    fraction would pass for healthy answers above the cap. The difference is rounded, not each
    count: both counts carry the window's extrapolation (6 answers read as 6.54, 4 of them
    aborted as 4.35), and rounding each would turn it into a whole phantom answer (7 - 4).
    Answers are whole; where counts are large the rounding changes nothing that matters."""
    aborted = dict(aborts)
    return [
        (le, float(max(0, round(count - aborted.get(le, 0.0)))))
        for le, count in sorted(completions)
    ]


def histogram_share_above(buckets: Sequence[tuple[float, float]], cap: int) -> float:
    """Share of the observations in cumulative ``buckets`` longer than ``cap`` (0 when empty)."""
    ordered = sorted(buckets)
    total = ordered[-1][1] if ordered else 0.0
    if total <= 0:
        return 0.0
    return max(0.0, 1.0 - histogram_count_le(ordered, cap) / total)
