"""Medians, ranges, speedup direction and number formatting."""

import pytest

from harness.stats import Summary, format_value, speedup, summarise


def test_summarise_odd_and_even_counts():
    assert summarise([3.0, 1.0, 2.0]) == Summary(3, 2.0, 1.0, 3.0)
    assert summarise([4.0, 1.0, 2.0, 3.0]) == Summary(4, 2.5, 1.0, 4.0)


def test_summarise_empty_is_none():
    assert summarise([]) is None


def test_speedup_higher_is_better_uses_config_range():
    base = Summary(5, 100.0, 90.0, 110.0)
    mine = Summary(5, 150.0, 120.0, 160.0)
    result = speedup(mine, base, higher_is_better=True)
    assert result.median == pytest.approx(1.5)
    assert result.low == pytest.approx(1.2)
    assert result.high == pytest.approx(1.6)


def test_speedup_lower_is_better_inverts_and_swaps_range():
    base = Summary(5, 10.0, 9.0, 11.0)
    mine = Summary(5, 5.0, 4.0, 8.0)
    result = speedup(mine, base, higher_is_better=False)
    assert result.median == pytest.approx(2.0)
    assert result.low == pytest.approx(10.0 / 8.0)  # slowest run is the worst speedup
    assert result.high == pytest.approx(2.5)


def test_speedup_with_zero_is_none():
    zero = Summary(1, 0.0, 0.0, 0.0)
    some = Summary(1, 1.0, 1.0, 1.0)
    assert speedup(some, zero, higher_is_better=True) is None
    assert speedup(zero, some, higher_is_better=False) is None


@pytest.mark.parametrize(
    "value, text",
    [(1234567.0, "1,234,567"), (123.4, "123"), (12.34, "12.3"), (1.234, "1.23"), (0.01234, "0.0123"), (0.0, "0")],
)
def test_format_value(value, text):
    assert format_value(value) == text


def test_paired_ratio_pairs_by_repetition_and_orients_to_better():
    from harness.stats import paired_ratio

    mine = {0: 110.0, 1: 90.0, 2: 100.0}
    other = {0: 100.0, 1: 100.0, 3: 50.0}  # rep 2 and 3 have no partner
    r = paired_ratio(mine, other, higher_is_better=True)
    assert r.n == 2 and r.median == pytest.approx(1.0)
    assert r.low == pytest.approx(0.9) and r.high == pytest.approx(1.1)
    # A time: half the time is twice as good.
    t = paired_ratio({0: 1.0}, {0: 2.0}, higher_is_better=False)
    assert (t.n, t.median, t.low, t.high) == (1, 2.0, 2.0, 2.0)
    assert paired_ratio({0: 1.0}, {1: 1.0}, True) is None
    assert paired_ratio({0: 1.0}, {0: 0.0}, True) is None


def test_paired_ratio_interval_is_reproducible_and_narrows_with_more_pairs():
    import random

    from harness.stats import paired_ratio

    rng = random.Random(7)
    def draw(n):
        base = {i: 100.0 * rng.uniform(0.85, 1.15) for i in range(n)}
        return {i: v * rng.uniform(0.9, 1.1) for i, v in base.items()}, base
    few, many = draw(6), draw(200)
    a = paired_ratio(*few, higher_is_better=True)
    assert a == paired_ratio(*few, higher_is_better=True)  # seeded bootstrap
    b = paired_ratio(*many, higher_is_better=True)
    assert a.low <= a.median <= a.high and b.low <= b.median <= b.high
    assert b.high - b.low < (a.high - a.low) / 2


def test_overhead_says_undecided_where_the_interval_straddles_the_target():
    import overhead

    assert overhead.within_target(0.99, 1.008) == "yes"
    assert overhead.within_target(1.012, 1.03) == "no"
    assert overhead.within_target(1.003, 1.021) == "undecided"
    low, high = overhead.cost_interval([1.02, 1.00, 1.04, 0.98], [1.0, 1.0, 1.0, 1.0])
    assert low <= 1.01 <= high
    # A row from before the intervals keeps its median verdict, labelled as such.
    assert overhead.verdict({"own_within_1pct": True}, "own_within_1pct") == "yes (median only)"
    assert overhead.interval({}, "own_ratio_interval95") == ""
