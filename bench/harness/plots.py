"""PNG plots of a suite's results (matplotlib, Agg backend: no display needed).

Four figures: speedup over baseline per workload and configuration; wake-latency
CDFs from `gleaner probe --json`; the active-vCPU timeline of a phase-changing run;
and idle-transition rate against speedup, our workloads' version of the paper's
Figure 1. Each function takes the results dictionary (or part of it) and a path and
returns the path written, or None with the reason when there is nothing to plot.
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first
from matplotlib.ticker import MaxNLocator  # noqa: E402

from . import report  # noqa: E402


def _ran_configs(results: dict) -> list[str]:
    return [config["name"] for config in results["configs"] if config["status"] == "ran"]


# A bar's median with its min and max, or None for no bar.
Bar = tuple[float, float, float] | None


def range_bars(
    groups: list[str],
    series: list[tuple[str, list[Bar]]],
    path: Path,
    *,
    ylabel: str,
    title: str | None = None,
    figsize: tuple[float, float] = (6, 4.5),
    rotate_labels: bool = False,
) -> Path | None:
    """Grouped bars of medians with min–max whiskers and a line at 1.0 (no change).

    One group per name in `groups`; each series gives one bar (or None) per group. Shared
    by the suites' speedup plot and the test bed's (testbed/tbd/summary.py).
    """
    if not groups or not series:
        return None
    figure, axes = plt.subplots(figsize=figsize)
    width = 0.8 / len(series)
    for index, (label, bars) in enumerate(series):
        xs, heights, lows, highs = [], [], [], []
        for position, bar in enumerate(bars):
            if bar is None:
                continue
            median, low, high = bar
            xs.append(position + (index - (len(series) - 1) / 2) * width)
            heights.append(median)
            lows.append(median - low)
            highs.append(high - median)
        axes.bar(xs, heights, width, yerr=[lows, highs], capsize=3, label=label)
    axes.axhline(1.0, color="black", linewidth=0.8)
    if rotate_labels:
        axes.set_xticks(range(len(groups)), groups, rotation=30, ha="right")
    else:
        axes.set_xticks(range(len(groups)), groups)
    axes.set_ylabel(ylabel)
    if title:
        axes.set_title(title)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def speedup_bars(results: dict, path: Path) -> Path | None:
    """Grouped bars: one group per workload, one bar per non-baseline configuration."""
    configs = [name for name in _ran_configs(results) if name != "baseline"]
    workloads = [w for w in results["workloads"] if not w.get("error")]
    if not configs or not workloads:
        return None
    series = []
    for config in configs:
        bars: list[Bar] = []
        for workload in workloads:
            entry = workload["summary"][config]
            if entry["speedup"] is None:
                bars.append(None)
            else:
                bars.append((entry["speedup"], entry["speedup_min"], entry["speedup_max"]))
        series.append((config, bars))
    return range_bars(
        [w["name"] for w in workloads],
        series,
        path,
        ylabel="speedup over baseline (median; bars: min–max)",
        title=f"suite {results['suite']}: speedup vs baseline",
        figsize=(max(6, 1.2 * len(workloads) * max(1, len(configs)) / 3), 4.5),
        rotate_labels=True,
    )


# Keys that name a list item in a series label (e.g. a probe point's setting and gap).
LABEL_KEYS = ("name", "label", "kind", "setting", "gap_ns")
_QUANTILE_KEY = re.compile(r"^(?:p(\d+(?:_\d+)?)|min|max)(?:_(ns|us|ms))?$")


def quantile_of(key: str) -> float | None:
    """`p50`/`p50_ns` -> 0.5, `p99_9` -> 0.999, `min` -> 0, `max_ns` -> 1; else None."""
    match = _QUANTILE_KEY.match(str(key).lower())
    if not match:
        return None
    if match.group(1) is None:
        return 0.0 if str(key).lower().startswith("min") else 1.0
    value = float(match.group(1).replace("_", "."))
    return value / 100 if 0 < value <= 100 else None


def latency_series(probe: object, prefix: str = "") -> list[tuple[str, list[tuple[float, float]]]]:
    """(label, [(latency, cumulative fraction)]) series found anywhere in a probe JSON.

    `gleaner probe --json` reports, per (setting, gap) point, nearest-rank percentiles
    (`min_ns`, `p50_ns`, `p90_ns`, `p99_ns`, `max_ns`); an object with at least two
    such keys becomes one series. A list of raw numbers under a key mentioning
    "samples" becomes an empirical CDF, should the probe ever include raw samples.
    """
    found: list[tuple[str, list[tuple[float, float]]]] = []
    if isinstance(probe, dict):
        quantiles = [
            (float(value), quantile_of(key))
            for key, value in probe.items()
            if _is_number(value) and quantile_of(key) is not None
        ]
        if len(quantiles) >= 2:
            found.append((prefix or "probe", sorted(quantiles)))
        for key, value in probe.items():
            label = f"{prefix} {key}".strip() if key != "latency" else prefix
            numbers = _numbers(value)
            if "sample" in str(key).lower() and numbers:
                ordered = sorted(numbers)
                found.append((label, [(x, (i + 1) / len(ordered)) for i, x in enumerate(ordered)]))
            elif isinstance(value, (dict, list)):
                found += latency_series(value, label)
    elif isinstance(probe, list):
        for index, item in enumerate(probe):
            if isinstance(item, dict):
                name = " ".join(f"{item[key]}" if key != "gap_ns" else f"gap {item[key] / 1000:g}us"
                                for key in LABEL_KEYS if key in item) or str(index)
                found += latency_series(item, name)
    return found


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numbers(value: object) -> list[float]:
    if isinstance(value, list) and value and all(_is_number(x) for x in value):
        return [float(x) for x in value]
    return []


def latency_cdf(probe: object, path: Path) -> Path | None:
    """One panel per probe setting (same vCPU, busy, halted, ...), one line per gap."""
    series = latency_series(probe)
    if not series:
        return None
    panels: dict[str, list[tuple[str, list[tuple[float, float]]]]] = {}
    for label, points in series:
        setting, _, gap = label.partition(" gap ")
        panels.setdefault(setting, []).append((f"gap {gap}" if gap else label, points))
    figure, axes_row = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), sharex=True, sharey=True,
                                    squeeze=False)
    for axes, (setting, lines) in zip(axes_row[0], panels.items(), strict=True):
        for label, points in lines:
            axes.step([x for x, _ in points], [y for _, y in points], where="post", label=label,
                      marker="." if len(points) < 20 else None)
        axes.set_xscale("log")
        axes.set_title(setting, fontsize="medium")
        axes.set_xlabel("wake latency (ns)")
        axes.legend(fontsize="x-small")
    axes_row[0][0].set_ylabel("cumulative fraction (min, p50, p90, p99, max)")
    figure.suptitle("wake-latency CDF per setting (gleaner probe)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def active_timeline(timeline: list[dict], phases: list[tuple[str, float]], path: Path) -> Path | None:
    """Step plot of active vCPUs over time, with the workload's phase boundaries."""
    if not timeline:
        return None
    figure, axes = plt.subplots(figsize=(7, 3.5))
    axes.step([row["t_s"] for row in timeline], [row["n_active"] for row in timeline], where="post")
    start = 0.0
    for label, seconds in phases:
        axes.axvspan(start, start + seconds, alpha=0.12, color="tab:orange" if label == "coarse" else "tab:blue")
        axes.text(start + seconds / 2, 0.2, label, ha="center")
        start += seconds
    axes.set_ylim(0, max(row["n_active"] for row in timeline) + 0.5)
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("time since gleaner start (s)")
    axes.set_ylabel("active vCPUs")
    axes.set_title("gleaner active vCPUs, pipeline " + ",".join(f"{label}:{seconds:g}s" for label, seconds in phases))
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def idle_vs_speedup(results: dict, path: Path) -> Path | None:
    """x: baseline idle transitions/s per vCPU; y: each configuration's speedup.

    The paper's Figure 1 plots slowdown under virtualisation against idle-transition
    frequency. Inside one guest we cannot run native, so the y axis is the
    performance baseline leaves on the table relative to each mitigation.
    """
    configs = [name for name in _ran_configs(results) if name != "baseline"]
    figure, axes = plt.subplots(figsize=(6.5, 4.5))
    plotted = False
    for config in configs:
        xs, ys, names = [], [], []
        for workload in results["workloads"]:
            if workload.get("error"):
                continue
            rate = report.mean_idle_rate(workload, "baseline")
            ratio = workload["summary"][config]["speedup"]
            if rate is None or ratio is None:
                continue
            xs.append(rate)
            ys.append(ratio)
            names.append(workload["name"])
        if xs:
            plotted = True
            axes.scatter(xs, ys, label=config)
            for x, y, name in zip(xs, ys, names, strict=True):
                axes.annotate(name, (x, y), fontsize=6, alpha=0.7)
    if not plotted:
        plt.close(figure)
        return None
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xlabel(f"baseline idle transitions / s / vCPU ({results['idle_source']})")
    axes.set_ylabel("speedup over baseline")
    axes.set_title("idle-transition rate vs speedup (cf. paper Fig. 1)")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
