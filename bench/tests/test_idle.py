"""Idle-transition counters from a fake sysfs tree and a captured /proc/timer_list."""

from pathlib import Path

import pytest

from harness.idle import (
    SOURCE_CPUIDLE,
    SOURCE_TIMER_LIST,
    IdleCounters,
    IdleSourceError,
    idle_rates,
    parse_timer_list,
    read_idle_counters,
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
