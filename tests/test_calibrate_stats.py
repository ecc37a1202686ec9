"""The pure statistics of ``coherence-guard calibrate``: curves, quantiles, recommendations."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.cli.calibrate.stats import (
    Observation,
    Setting,
    best_setting,
    histogram_quantile,
    histogram_survival,
    quantile,
    recommend_cap,
    survival_at,
    survival_curve,
    truncated_share,
)

Obs = Observation


def test_survival_drops_at_each_degeneration_and_ends_at_the_horizon() -> None:
    """Four answers, two degenerate at 100 and 250: 1.0 → 0.75 at 100 → 0.5 at 250, flat to
    max_tokens. Answers that stopped coherent early never count as degenerate."""
    answers = [Obs(400, 100, "repetition"), Obs(80), Obs(400, 250, "near-repetition"), Obs(400)]
    assert survival_curve(answers, 400) == [(0, 1.0), (100, 0.75), (250, 0.5), (400, 0.5)]


def test_answers_degenerating_at_the_same_token_make_one_step() -> None:
    assert survival_curve([Obs(10, 5), Obs(10, 5), Obs(10)], 10) == [
        (0, 1.0),
        (5, 1 / 3),
        (10, 1 / 3),
    ]


def test_no_answers_no_curve_and_no_degeneration_a_flat_one() -> None:
    assert survival_curve([], 100) == []
    assert survival_curve([Obs(50), Obs(100)], 100) == [(0, 1.0), (100, 1.0)]


def test_survival_at_reads_the_step_function() -> None:
    curve = [(0, 1.0), (100, 0.75), (250, 0.5), (400, 0.5)]
    assert survival_at(curve, 99) == 1.0
    assert survival_at(curve, 100) == 0.75
    assert survival_at(curve, 399) == 0.5
    assert survival_at(curve, 401) is None
    assert survival_at([], 1) is None


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1, 2, 3, 4], 0.5, 2.5),
        ([1, 2, 3, 4], 0.0, 1.0),
        ([1, 2, 3, 4], 1.0, 4.0),
        ([10, 20, 30, 40, 50], 0.1, 14.0),
        ([7], 0.3, 7.0),
        ([40, 10, 30, 20], 0.25, 17.5),
    ],
    ids=["median", "min", "max", "p10", "single", "unsorted"],
)
def test_quantile_interpolates_like_numpy(values: list[float], q: float, expected: float) -> None:
    assert quantile(values, q) == pytest.approx(expected)


def test_quantile_rejects_nothing_and_out_of_range() -> None:
    with pytest.raises(ValueError, match="no values"):
        quantile([], 0.5)
    with pytest.raises(ValueError, match="outside"):
        quantile([1], 1.5)


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=50), st.floats(0, 1))
def test_quantile_stays_within_the_data_and_grows_with_q(values: list[int], q: float) -> None:
    """Property: min <= quantile <= max, and a higher q never gives a lower value."""
    value = quantile(values, q)
    assert min(values) <= value <= max(values) or math.isclose(value, min(values))
    assert quantile(values, min(1.0, q + 0.1)) >= value - 1e-9


def test_the_cap_is_the_quantile_minus_the_margin_and_below_every_measured_loop() -> None:
    """Positions 300..660: the 0.1 quantile is 336, minus 32 is 304; with quantile 0 the cap sits
    below every loop measured."""
    points = [300, 340, 380, 420, 460, 500, 540, 580, 620, 660]
    assert recommend_cap(points, 0.1, 32) == 304
    assert recommend_cap(points, 0.0, 10) == 290 < min(points)
    assert recommend_cap([], 0.1, 32) is None
    assert recommend_cap([20], 0.1, 64) == 1  # never below one token


def test_truncated_share_counts_only_coherent_answers_longer_than_the_cap() -> None:
    answers = [Obs(500, 200), Obs(120), Obs(300), Obs(90)]
    assert truncated_share(answers, 250) == pytest.approx(1 / 3)
    assert truncated_share([Obs(500, 200)], 10) == 0.0


def test_best_setting_has_fewest_loops_and_is_the_mildest_among_equals() -> None:
    loop, fine = Obs(400, 200), Obs(150)
    by_setting = {
        Setting(1.0, 0.0): [loop, loop, loop],
        Setting(1.1, 0.0): [loop, fine, fine],
        Setting(1.3, 0.0): [fine, fine, fine],
        Setting(1.2, 0.0): [fine, fine, fine],
        Setting(1.2, 0.7): [fine, fine, fine],
    }
    assert best_setting(by_setting) == Setting(1.2, 0.0)
    assert best_setting({Setting(1.0, 0.0): []}) is None


def test_histogram_quantile_matches_prometheus_interpolation() -> None:
    """Cumulative buckets (le, count) as Prometheus stores them: rank 0.5*10 = 5 falls in
    (256, 512] holding counts 2..8, so 256 + 256 * (5-2)/(8-2) = 384."""
    buckets = [(128.0, 0.0), (256.0, 2.0), (512.0, 8.0), (1024.0, 10.0), (math.inf, 10.0)]
    assert histogram_quantile(buckets, 0.5) == pytest.approx(384.0)
    assert histogram_quantile(buckets, 0.1) == pytest.approx(128.0 + 128.0 * 1 / 2)
    assert histogram_quantile([(16.0, 0.0), (math.inf, 3.0)], 0.5) == 16.0  # rank in +Inf
    assert histogram_quantile([(16.0, 0.0), (math.inf, 0.0)], 0.5) is None
    assert histogram_quantile([], 0.5) is None


def test_histogram_survival_is_one_minus_aborted_share_per_bound() -> None:
    buckets = [(256.0, 2.0), (512.0, 8.0), (math.inf, 10.0)]
    assert histogram_survival(buckets, 40.0) == [(256.0, 0.95), (512.0, 0.8)]
    assert histogram_survival(buckets, 0.0) == []


@given(
    st.lists(
        st.tuples(st.integers(1, 500), st.one_of(st.none(), st.integers(1, 500))),
        min_size=1,
        max_size=40,
    )
)
def test_survival_never_rises_and_ends_at_the_coherent_share(
    answers: list[tuple[int, int | None]],
) -> None:
    """Property: the curve starts at 1, never rises, its steps sit at degeneration positions,
    and at the horizon it equals the share of answers that never degenerated."""
    observations = [Obs(tokens, at) for tokens, at in answers]
    curve = survival_curve(observations, 500)
    shares = [share for _, share in curve]
    assert curve[0] == (0, 1.0) and curve[-1][0] == 500
    assert all(a >= b for a, b in itertools.pairwise(shares))
    steps = {k for k, _ in curve[1:-1]}
    assert steps <= {at for _, at in answers if at is not None}
    coherent = sum(at is None for _, at in answers) / len(answers)
    assert curve[-1][1] == pytest.approx(coherent)
