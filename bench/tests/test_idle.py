"""Idle-transition counters from a fake sysfs tree, a captured /proc/timer_list and
captured (or faked) `perf stat` output."""

import sys
from pathlib import Path

import pytest

from harness.idle import (
    SOURCE_CPUIDLE,
    SOURCE_TIMER_LIST,
    IdleCounters,
    IdleSourceError,
    PerfIdleCounter,
    idle_rates,
    parse_perf_stat,
    parse_timer_list,
    read_idle_counters,
    tracepoint_present,
)

# Abridged from this machine's /proc/timer_list (kernel 6.18): per-CPU tick_sched
# blocks, and a later "Tick Device" section that must not confuse the parser.
TIMER_LIST = """Timer List Version: v0.9
HRTIMER_MAX_CLOCK_BASES: 8
now at 367645247758 nsecs

cpu: 0
 clock 0:
  .base:       pK-error
  .index:      0
  .nohz_mode      : 2
  .idle_tick      : 367640000000 nsecs
  .tick_stopped   : 1
  .idle_jiffies   : 4295034996
  .idle_calls     : 7232
  .idle_sleeps    : 6995
  .idle_entrytime : 367645112004 nsecs
  .idle_sleeptime : 367645247758 nsecs
  .iowait_sleeptime: 1093750 nsecs

cpu: 1
 clock 0:
  .idle_calls     : 5288
  .idle_sleeps    : 5100
  .idle_sleeptime : 354729568373 nsecs

Tick Device: mode:     1
Per CPU device: 0
Clock Event Device: lapic-deadline
"""


def make_cpuidle(root: Path, usage: dict[int, list[int]]) -> None:
    for cpu, states in usage.items():
        for index, count in enumerate(states):
            state = root / "devices/system/cpu" / f"cpu{cpu}" / "cpuidle" / f"state{index}"
            state.mkdir(parents=True)
            (state / "usage").write_text(f"{count}\n")


def test_parse_timer_list_per_cpu():
    assert parse_timer_list(TIMER_LIST) == {0: 7232, 1: 5288}


def test_cpuidle_preferred_and_summed_over_states(tmp_path):
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    make_cpuidle(sys_root, {0: [10, 5], 1: [7]})
    (sys_root / "devices/system/cpu/cpufreq").mkdir()  # non-cpuN entries are ignored
    proc_root.mkdir()
    (proc_root / "timer_list").write_text(TIMER_LIST)
    assert read_idle_counters(sys_root, proc_root) == IdleCounters(SOURCE_CPUIDLE, {0: 15, 1: 7})


def test_falls_back_to_timer_list_without_cpuidle_states(tmp_path):
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    (sys_root / "devices/system/cpu/cpu0").mkdir(parents=True)  # no cpuidle dir, like driver "none"
    proc_root.mkdir()
    (proc_root / "timer_list").write_text(TIMER_LIST)
    assert read_idle_counters(sys_root, proc_root) == IdleCounters(SOURCE_TIMER_LIST, {0: 7232, 1: 5288})


def test_no_source_names_both_paths(tmp_path):
    with pytest.raises(IdleSourceError, match="timer_list") as error:
        read_idle_counters(tmp_path / "sys", tmp_path / "proc")
    assert "cpuidle" in str(error.value)


def test_timer_list_without_idle_calls_is_an_error(tmp_path):
    (tmp_path / "timer_list").write_text("Timer List Version: v0.9\n")
    with pytest.raises(IdleSourceError, match="idle_calls"):
        read_idle_counters(tmp_path / "sys", tmp_path)


def test_idle_rates_per_second():
    before = IdleCounters(SOURCE_TIMER_LIST, {0: 100, 1: 50})
    after = IdleCounters(SOURCE_TIMER_LIST, {0: 300, 1: 50})
    assert idle_rates(before, after, 2.0) == {0: 100.0, 1: 0.0}
    with pytest.raises(ValueError, match="positive"):
        idle_rates(before, after, 0.0)
    with pytest.raises(ValueError, match="differ"):
        idle_rates(before, IdleCounters(SOURCE_CPUIDLE, {0: 1}), 1.0)


# `perf stat -a -A -e power:cpu_idle -x, -o FILE` on this machine (perf 6.1).
PERF_STAT = """# started on Mon Nov 23 07:30:10 2026

CPU0,528,,power:cpu_idle,1003055645,100.00,,
CPU1,91,,power:cpu_idle,1003060697,100.00,,
"""


def test_parse_perf_stat_per_cpu_raw_hits():
    assert parse_perf_stat(PERF_STAT) == {0: 528, 1: 91}


def test_parse_perf_stat_rejects_uncounted_cpus_and_empty_output():
    with pytest.raises(IdleSourceError, match="not counted"):
        parse_perf_stat(PERF_STAT.replace("CPU1,91,", "CPU1,<not counted>,"))
    with pytest.raises(IdleSourceError, match="no per-CPU"):
        parse_perf_stat("# started on Mon Nov 23 07:30:10 2026\n\n")


def test_tracepoint_found_in_tracefs_or_debugfs(tmp_path):
    assert not tracepoint_present(tmp_path)
    event = tmp_path / "kernel/debug/tracing/events/power/cpu_idle"
    event.mkdir(parents=True)
    (event / "id").write_text("568\n")
    assert tracepoint_present(tmp_path)


# Speaks perf's side of the protocol: acknowledges `enable` on the control pipe, runs
# until its stdin closes (the counted `cat`), then writes one session's counts.
FAKE_PERF = """#!{python}
import os, sys
args = sys.argv[1:]
out = args[args.index("-o") + 1]
ctl, ack = map(int, args[args.index("--control") + 1][len("fd:"):].split(","))
if {fail}:
    sys.stderr.write("Error:\\nNo permission to enable power:cpu_idle event.\\n")
    sys.exit(1)
assert os.read(ctl, 64).startswith(b"enable")
os.write(ack, b"ack\\n\\0")
sys.stdin.read()
with open(out, "w") as f:
    f.write("# started\\n\\nCPU0,7,,power:cpu_idle,1,100.00,,\\nCPU1,4,,power:cpu_idle,1,100.00,,\\n")
"""


def fake_perf(tmp_path: Path, fail: bool = False) -> str:
    path = tmp_path / "perf"
    path.write_text(FAKE_PERF.format(python=sys.executable, fail=fail))
    path.chmod(0o755)
    return str(path)


def test_perf_counter_is_cumulative_over_sessions_and_halves_hits(tmp_path):
    counter = PerfIdleCounter(fake_perf(tmp_path))
    try:
        # First read: one short session (7 and 4 hits); each later read ends one more.
        assert counter.read() == {0: 3, 1: 2}
        assert counter.read() == {0: 7, 1: 4}
        assert counter.read() == {0: 10, 1: 6}
    finally:
        counter.close()


def test_perf_failure_is_an_idle_source_error_with_perfs_message(tmp_path):
    counter = PerfIdleCounter(fake_perf(tmp_path, fail=True))
    with pytest.raises(IdleSourceError, match="No permission"):
        counter.read()
    counter.close()
