"""Summary statistics for repeated runs: medians with min-max ranges and speedups.

With five or so repetitions on a shared 2-vCPU guest, means and standard deviations
are dominated by the odd disturbed run; the median with the full min-max range shows
both the typical value and how far the worst and best runs strayed.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    min: float
    max: float


@dataclass(frozen=True)
class Speedup:
    """Speedup of a configuration over the baseline median (>1 means better).

    `low`/`high` divide the configuration's worst/best run by the baseline median,
    so the error bar is the configuration's own spread on the speedup scale.
    """

    median: float
    low: float
    high: float


def summarise(values: list[float]) -> Summary | None:
    """Median and range of `values`; None when there are none (every run failed)."""
    if not values:
        return None
    return Summary(len(values), statistics.median(values), min(values), max(values))


def speedup(config: Summary, baseline: Summary, higher_is_better: bool) -> Speedup | None:
    """Speedup of `config` over `baseline`; None when a zero makes the ratio meaningless."""
    if higher_is_better:
        if baseline.median == 0:
            return None
        return Speedup(config.median / baseline.median, config.min / baseline.median, config.max / baseline.median)
    if config.median == 0 or config.min == 0:
        return None
    # Lower is better (a time): the slowest run (max) is the worst speedup.
    return Speedup(baseline.median / config.median, baseline.median / config.max, baseline.median / config.min)


@dataclass(frozen=True)
class PairedRatio:
    """How a configuration compares with another run in the same repetition (>1 is better).

    `median` is the median of the per-repetition ratios; `low`/`high` bound a 95 % bootstrap
    interval of that median. Pairing by repetition takes out the host's drift between
    repetitions, and the interval says how far the median itself may be from the truth: on
    the haltpoll guest one run of `sysbench threads` strays ±15 % from the next (σ ≈ 7 %), so
    a median of 5 ratios is uncertain by several percent either way, more than the 3-5 %
    margins it is judged against (results/overhead-presence-2026-11-25/).
    """

    n: int
    median: float
    low: float
    high: float


#: Bootstrap resamples behind a `PairedRatio` interval; seeded, so a report is reproducible.
BOOTSTRAP_RESAMPLES = 2000


def paired_ratio(mine: dict[int, float], other: dict[int, float], higher_is_better: bool,
                 seed: int = 0) -> PairedRatio | None:
    """`mine` against `other`, values keyed by repetition; only repetitions with both count.
    None without a pair or with a zero that makes a ratio meaningless."""
    ratios = paired_ratios(mine, other, higher_is_better)
    return ratio_summary(ratios, seed) if ratios else None


def paired_ratios(mine: dict[int, float], other: dict[int, float], higher_is_better: bool) -> list[float]:
    """The per-repetition ratios of `mine` against `other` (>1: `mine` better), in repetition
    order; empty without a pair or when a zero would make one meaningless."""
    reps = sorted(set(mine) & set(other))
    if higher_is_better:
        pairs = [(mine[r], other[r]) for r in reps]
    else:
        pairs = [(other[r], mine[r]) for r in reps]
    if any(den == 0 for _, den in pairs):
        return []
    return [num / den for num, den in pairs]


def ratio_summary(ratios: list[float], seed: int = 0) -> PairedRatio:
    """The median of `ratios` (not empty) with its 95 % bootstrap interval."""
    low, high = median_interval(ratios, seed)
    return PairedRatio(len(ratios), statistics.median(ratios), low, high)


def median_interval(values: list[float], seed: int = 0) -> tuple[float, float]:
    """A 95 % bootstrap interval of the median of `values` (seeded: the same values give the
    same interval). `values` must not be empty."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(BOOTSTRAP_RESAMPLES))
    tail = int(0.025 * BOOTSTRAP_RESAMPLES)
    return medians[tail], medians[-1 - tail]


def format_value(value: float) -> str:
    """Three significant digits without scientific notation for the usual ranges."""
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"
