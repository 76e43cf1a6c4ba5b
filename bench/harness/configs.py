"""The configurations every workload is measured under, and their interleaved order.

A configuration is a way of launching the same command: as is, under one of
gleaner's modes, pinned to one vCPU, or with guest halt polling. Runs are interleaved
rather than grouped so that slow drifts of the host (other tenants, thermal state, page
cache) spread evenly over all configurations instead of biasing whichever one happened to
run last. Each round takes its own order, rows of a balanced Latin square: in a fixed order
(A B C ... A B C ...) `gleaner` always ran right after `baseline`, so a drift within a
round, or what one run leaves to the next (a warm page cache, a vCPU the host just
descheduled), fell on the same pair every time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar


@dataclass(frozen=True)
class Config:
    name: str
    description: str
    # argv prefix placed before the workload command; "{gleaner}" is the CLI binary
    # and "{timeline}" the per-run timeline file.
    prefix: tuple[str, ...]
    uses_gleaner: bool = False
    records_timeline: bool = False
    sets_haltpoll: bool = False

    def wrap(self, argv: list[str], gleaner: Path, timeline: Path | None) -> list[str]:
        """The full command line that runs `argv` under this configuration."""
        if self.records_timeline and timeline is None:
            raise ValueError(f"configuration {self.name} needs a timeline path")
        wrapped = []
        for part in self.prefix:
            if part == "{gleaner}":
                wrapped.append(str(gleaner))
            elif part == "{timeline}":
                wrapped.append(str(timeline))
            else:
                wrapped.append(part)
        return wrapped + list(argv)


CONFIGS: tuple[Config, ...] = (
    Config("baseline", "the command as is", ()),
    Config(
        "gleaner",
        "gleaner run (retention + consolidation policy), timeline recorded",
        ("{gleaner}", "run", "--timeline", "{timeline}", "--"),
        uses_gleaner=True,
        records_timeline=True,
    ),
    Config(
        "retention",
        "gleaner run --mode retention (idle retention only)",
        ("{gleaner}", "run", "--mode", "retention", "--"),
        uses_gleaner=True,
    ),
    Config(
        "consolidation",
        "gleaner run --mode consolidation (vCPU consolidation only)",
        ("{gleaner}", "run", "--mode", "consolidation", "--"),
        uses_gleaner=True,
    ),
    Config(
        "yield-loop",
        "gleaner run --mode always-yield (SCHED_IDLE yield loop on every vCPU, no policy)",
        ("{gleaner}", "run", "--mode", "always-yield", "--"),
        uses_gleaner=True,
    ),
    Config("one-vcpu", "taskset -c 0 (everything on vCPU 0)", ("taskset", "-c", "0")),
    Config(
        "haltpoll",
        "guest_halt_poll_ns=200000 during the run",
        (),
        sets_haltpoll=True,
    ),
    # The yardstick for every paired ratio: on the haltpoll guest 24 interleaved rounds of the
    # fine pipeline put one bare run at x0.954 [0.913, 0.987] of another
    # (results/presence-fine-pipeline-2026-11-27), as far as any Gleaner configuration.
    Config(
        "control",
        "the command as is again: how far two identical runs drift apart here",
        (),
    ),
)

#: Configurations that are not settings a user could choose: never the best fixed setting.
CONTROLS = ("control",)

CONFIG_NAMES = tuple(config.name for config in CONFIGS)


def select_configs(names: list[str] | None) -> list[Config]:
    """Configurations by name in canonical order; all when `names` is None."""
    if names is None:
        return list(CONFIGS)
    unknown = [name for name in names if name not in CONFIG_NAMES]
    if unknown:
        raise ValueError(f"unknown configuration(s) {', '.join(unknown)}; choose from {', '.join(CONFIG_NAMES)}")
    if "baseline" not in names:
        raise ValueError("the configurations must include baseline (speedups are relative to it)")
    return [config for config in CONFIGS if config.name in names]


Item = TypeVar("Item")


def balanced_orders(n: int, rounds: int) -> list[list[int]]:
    """`rounds` orders of the indices 0..n-1, rows of a Williams (balanced Latin) square.

    Over each full cycle (n rounds for an even n, 2n for an odd one) every index takes every
    position equally often and directly follows every other index equally often, so neither
    a drift within a round nor what one run leaves to the next favours a configuration.
    Rounds past a cycle start it again.
    """
    if n < 1:
        return [[] for _ in range(rounds)]
    # The first row 0, 1, n-1, 2, n-2, ...; row r adds r to each entry (mod n).
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(i + r) % n for i in first] for r in range(n)]
    if n % 2 == 1:
        # An odd square balances neighbours only together with its mirror image.
        rows += [list(reversed(row)) for row in rows]
    return [rows[r % len(rows)] for r in range(rounds)]


def interleave(configs: list[Item], reps: int) -> list[tuple[int, Item]]:
    """(rep, config) pairs: `reps` rounds of every configuration, each round in its own order
    ([`balanced_orders`]); the first round starts with the first configuration (baseline)."""
    if reps < 1:
        raise ValueError(f"repetitions must be at least 1, got {reps}")
    orders = balanced_orders(len(configs), reps)
    return [(rep, configs[i]) for rep in range(reps) for i in orders[rep]]
