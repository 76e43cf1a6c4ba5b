"""Workloads the suites measure, each reduced to one number per run.

A workload knows how to prepare its inputs, how to run once under a configuration's
launcher (`wrap`), and which number in its report is the metric. Idle-transition
counters are read right around the measured interval, so the rate describes the
workload itself and not the harness's setup work.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import parse, proc
from .cleanup import CleanupStack
from .idle import IdleCounters, IdleSourceError, idle_rates
from .mariadb import MariaDBError, PrivateServer

Wrap = Callable[[list[str]], list[str]]


class WorkloadError(Exception):
    """A run failed: non-zero exit, timeout or a report without the metric."""


@dataclass
class RunContext:
    """What a workload needs from the harness while running."""

    gleaner: Path
    stack: CleanupStack
    workdir: Path  # private scratch directory for this suite run
    read_idle: Callable[[], IdleCounters] | None  # None when no idle source is readable


@dataclass(frozen=True)
class Measurement:
    value: float
    wall_s: float
    idle_per_s: dict[int, float] | None  # idle transitions per second, per vCPU


class Workload(ABC):
    """One benchmark: name, metric and how to run it once."""

    def __init__(
        self,
        name: str,
        description: str,
        metric: str,
        unit: str,
        higher_is_better: bool,
        est_s: float,
        tools: tuple[str, ...],
        needs_gleaner: bool = False,
    ) -> None:
        self.name = name
        self.description = description
        self.metric = metric
        self.unit = unit
        self.higher_is_better = higher_is_better
        self.est_s = est_s  # expected seconds per run, for the suite's time estimate
        self.tools = tools  # executables that must be on PATH
        self.needs_gleaner = needs_gleaner  # the command itself is a gleaner subcommand

    def prepare(self, ctx: RunContext) -> None:
        """Creates inputs shared by all runs (default: nothing)."""

    def teardown(self, ctx: RunContext) -> None:
        """Removes what `prepare` created (default: nothing)."""

    @abstractmethod
    def measure(self, ctx: RunContext, wrap: Wrap) -> Measurement:
        """Runs once under `wrap` and returns the metric."""

    def timeout_s(self) -> float:
        return self.est_s * 4 + 60

    def describe(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "metric": self.metric,
            "unit": self.unit,
            "higher_is_better": self.higher_is_better,
        }


def _read_idle(ctx: RunContext) -> IdleCounters | None:
    if ctx.read_idle is None:
        return None
    try:
        return ctx.read_idle()
    except IdleSourceError:
        return None


def _rates(before: IdleCounters | None, after: IdleCounters | None, seconds: float) -> dict[int, float] | None:
    if before is None or after is None or seconds <= 0:
        return None
    return idle_rates(before, after, seconds)


def _substitute(argv: list[str], ctx: RunContext) -> list[str]:
    return [part.replace("{gleaner}", str(ctx.gleaner)).replace("{workdir}", str(ctx.workdir)) for part in argv]


class CommandWorkload(Workload):
    """A single command whose output (or wall time) yields the metric."""

    def __init__(
        self, *args, argv: list[str], metric_of: Callable[[str, float], float], capture: bool = True, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.argv = argv  # may contain {gleaner} and {workdir}
        self.metric_of = metric_of  # (output, wall seconds) -> metric
        self.capture = capture

    def command(self, ctx: RunContext) -> list[str]:
        return _substitute(self.argv, ctx)

    def measure(self, ctx: RunContext, wrap: Wrap) -> Measurement:
        argv = wrap(self.command(ctx))
        before = _read_idle(ctx)
        try:
            result = proc.run(argv, ctx.stack, self.timeout_s(), capture=self.capture)
        except proc.CommandError as error:
            raise WorkloadError(str(error)) from error
        after = _read_idle(ctx)
        if result.returncode != 0:
            raise WorkloadError(f"exit status {result.returncode}: {proc.tail(result.output)}")
        try:
            value = self.metric_of(result.output, result.wall_s)
        except parse.ParseError as error:
            raise WorkloadError(f"{error}; output: {proc.tail(result.output)}") from error
        return Measurement(value, result.wall_s, _rates(before, after, result.wall_s))


def generate_text(path: Path, size_bytes: int, seed: int) -> None:
    """Writes `size_bytes` of pseudo-English text from a seeded generator.

    Text rather than random bytes so that pigz does real match-finding work (random
    data is stored uncompressed); the fixed seed makes the file identical every time.
    """
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "pe", "ga", "do", "ze", "xu", "by", "qo", "fa"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(4096)]
    chunk_words = 65536
    written = 0
    with path.open("wb") as out:
        while written < size_bytes:
            chunk = (" ".join(rng.choices(words, k=chunk_words)) + "\n").encode()
            chunk = chunk[: size_bytes - written]
            out.write(chunk)
            written += len(chunk)


class PigzWorkload(CommandWorkload):
    """pigz compressing a generated text file; metric is input MB/s over the wall time."""

    SEED = 20140619  # the paper's conference date; any fixed value works

    def __init__(self, name: str, size_mib: int, est_s: float) -> None:
        self.size_bytes = size_mib * 1024 * 1024
        super().__init__(
            name,
            f"pigz -c of a {size_mib} MiB seeded text file (all vCPUs)",
            "throughput",
            "MB/s",
            True,
            est_s,
            ("pigz",),
            argv=["pigz", "-c", "{workdir}/pigz-input.txt"],
            metric_of=lambda _output, wall_s: self.size_bytes / 1e6 / wall_s,
            capture=False,
        )

    def prepare(self, ctx: RunContext) -> None:
        generate_text(ctx.workdir / "pigz-input.txt", self.size_bytes, self.SEED)

    def teardown(self, ctx: RunContext) -> None:
        (ctx.workdir / "pigz-input.txt").unlink(missing_ok=True)


class OltpWorkload(Workload):
    """sysbench oltp_read_write against a private MariaDB, server under the configuration."""

    def __init__(self, name: str, connections: int, seconds: int, tables: int = 2, table_size: int = 10_000) -> None:
        super().__init__(
            name,
            f"sysbench oltp_read_write, {connections} connections, {tables}x{table_size} rows, "
            f"{seconds} s; mariadbd wrapped, client outside",
            "transactions",
            "tx/s",
            True,
            seconds + 3,  # + server start and shutdown
            ("sysbench", "mariadbd", "mariadb-install-db", "mariadb", "mariadb-admin"),
        )
        self.connections = connections
        self.seconds = seconds
        self.tables = tables
        self.table_size = table_size
        self.server: PrivateServer | None = None

    def _sysbench(self, *extra: str) -> list[str]:
        if self.server is None:
            raise WorkloadError("OLTP workload used before prepare()")
        return [
            "sysbench",
            "oltp_read_write",
            *self.server.sysbench_args(),
            f"--tables={self.tables}",
            f"--table-size={self.table_size}",
            *extra,
        ]

    def _client(self, ctx: RunContext, argv: list[str], timeout_s: float) -> proc.Completed:
        try:
            result = proc.run(argv, ctx.stack, timeout_s)
        except proc.CommandError as error:
            raise WorkloadError(str(error)) from error
        if result.returncode != 0:
            raise WorkloadError(f"{' '.join(argv[:2])} exit status {result.returncode}: {proc.tail(result.output)}")
        return result

    def prepare(self, ctx: RunContext) -> None:
        self.server = PrivateServer(ctx.stack)
        self.server.initialise()
        self.server.start(self.server.server_argv())
        try:
            self.server.create_database()
            self._client(ctx, self._sysbench(f"--threads={min(self.tables, 4)}", "prepare"), 300)
        finally:
            self.server.stop()

    def teardown(self, ctx: RunContext) -> None:
        if self.server is None:
            return
        if not self.server.initialised:  # an interrupt already stopped and removed it
            self.server = None
            return
        try:
            self.server.start(self.server.server_argv())
            self.server.drop_database()
        finally:
            self.server.remove()
            self.server = None

    def measure(self, ctx: RunContext, wrap: Wrap) -> Measurement:
        if self.server is None:
            raise WorkloadError("OLTP workload measured before prepare()")
        try:
            self.server.start(wrap(self.server.server_argv()))
        except MariaDBError as error:
            raise WorkloadError(str(error)) from error
        try:
            before = _read_idle(ctx)
            result = self._client(
                ctx,
                self._sysbench(f"--threads={self.connections}", f"--time={self.seconds}", "--rand-seed=1", "run"),
                self.timeout_s(),
            )
            after = _read_idle(ctx)
        finally:
            self.server.stop()
        try:
            value = parse.sysbench_transactions_per_s(result.output)
        except parse.ParseError as error:
            raise WorkloadError(f"{error}; output: {proc.tail(result.output)}") from error
        return Measurement(value, result.wall_s, _rates(before, after, result.wall_s))
