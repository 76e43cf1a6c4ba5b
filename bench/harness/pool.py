"""Pooling the paired runs of several suite batches.

One batch of 12 rounds decides a paired ratio to about ±3 % on a shared 2-vCPU guest, no better
than the 3-5 % margins Gleaner is judged by, and the same command run twice strays as far. Batches
of the same suite on the same kind of guest can be pooled without losing the pairing: each pair
is still one configuration's run against the baseline run of the same round of the same batch.
Pure functions of the results dictionaries that `bench/run.py` writes, like `report`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .report import _table, values_by_rep
from .stats import PairedRatio, paired_ratios, ratio_summary


class PoolError(Exception):
    """A file that is not a results file of `bench/run.py`."""


@dataclass
class Batch:
    """One results file, as pooling sees it."""

    name: str
    commit: str
    driver: str
    load: float
    busy: bool  # the harness's load warning
    workloads: list[dict]


@dataclass
class Pooled:
    """Per (workload, configuration): every batch's ratios against `against` (baseline unless
    asked otherwise), and the batches used."""

    against: str = "baseline"
    used: list[Batch] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (name, why)
    ratios: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    per_batch: list[tuple[str, str, str, PairedRatio]] = field(default_factory=list)  # (batch, workload, config, ratio)


def batch_of(name: str, results: dict) -> Batch:
    """The fields pooling needs, or a PoolError naming what is missing."""
    try:
        host, load = results["host"], results["load"]
        return Batch(name, str(host.get("commit", "not recorded"))[:7], host["cpuidle_driver"],
                     float(load["before"][0]), bool(load["warning"]), list(results["workloads"]))
    except (KeyError, TypeError, IndexError, ValueError) as error:
        raise PoolError(f"{name}: not a results file of bench/run.py (missing or bad {error}); "
                        "pass the results/<suite>-<date>.json files it writes") from None


def ratios_against(workload: dict, config: str, against: str = "baseline") -> list[float]:
    """`config`'s runs against the `against` run of the same round (>1: `config` better)."""
    return paired_ratios(values_by_rep(workload, config), values_by_rep(workload, against),
                         workload["higher_is_better"])


def pool(batches: list[Batch], driver: str | None, include_busy: bool, against: str = "baseline") -> Pooled:
    """Pools the batches of one cpuidle driver (the first batch's when None), leaving out those
    that ran under a load warning unless `include_busy`. Each configuration is paired with the
    `against` run of its round: baseline by default; a fixed setting (e.g. one-vcpu, ping-pong's
    best) to pool Gleaner against the best static choice."""
    pooled = Pooled(against=against)
    if driver is None and batches:
        driver = batches[0].driver
    for batch in batches:
        if batch.driver != driver:
            pooled.skipped.append((batch.name, f"cpuidle driver {batch.driver}, not {driver}"))
            continue
        if batch.busy and not include_busy:
            pooled.skipped.append((batch.name, f"load warning (1-minute load {batch.load:.2f} at the start)"))
            continue
        pooled.used.append(batch)
        for workload in batch.workloads:
            if workload.get("error"):
                continue
            configs = sorted({run["config"] for run in workload["runs"]} - {against})
            for config in configs:
                ratios = ratios_against(workload, config, against)
                if not ratios:
                    continue
                pooled.ratios.setdefault((workload["name"], config), []).extend(ratios)
                pooled.per_batch.append((batch.name, workload["name"], config, ratio_summary(ratios)))
    return pooled


def _cell(ratio: PairedRatio) -> str:
    return f"×{ratio.median:.3f} [{ratio.low:.3f}, {ratio.high:.3f}] ({ratio.n})"


def markdown(pooled: Pooled, configs: list[str] | None) -> str:
    """The pooled table (one column per configuration against baseline), then every batch's."""
    shown = configs or sorted({config for _, config in pooled.ratios})
    workloads = list(dict.fromkeys(name for name, _ in pooled.ratios))
    lines = [f"Pooled over {len(pooled.used)} batch(es): "
             + ", ".join(f"{b.name} ({b.commit}, load {b.load:.2f})" for b in pooled.used) + "."]
    lines += [f"Left out: {name}: {why}." for name, why in pooled.skipped]
    lines += ["", f"Median of the pooled per-round ratios against {pooled.against} (>1: better) "
              "[95 % bootstrap interval of that median] (pairs):", ""]
    rows = [[workload] + [_cell(ratio_summary(pooled.ratios[(workload, c)])) if (workload, c) in pooled.ratios
                          else "–" for c in shown]
            for workload in workloads]
    lines += _table(["workload"] + [f"{c} vs {pooled.against}" for c in shown], rows)
    lines += ["", "Each batch:", ""]
    lines += _table(["batch", "workload", "configuration", f"against {pooled.against}"],
                    [[name, workload, config, _cell(ratio)]
                     for name, workload, config, ratio in pooled.per_batch if config in shown])
    return "\n".join(lines) + "\n"
