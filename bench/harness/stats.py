"""Summary statistics for repeated runs: medians with min-max ranges and speedups.

With five or so repetitions on a shared 2-vCPU guest, means and standard deviations
are dominated by the odd disturbed run; the median with the full min-max range shows
both the typical value and how far the worst and best runs strayed.
"""

from __future__ import annotations

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
