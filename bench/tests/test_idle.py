"""The harness's idle-entry reader: its protocol with `gleaner __idle-entries` (a fake
gleaner), and the real parser in gleaner_linux::idle_entries run on fake kernel trees.

The parsing itself is tested where it lives (Rust); the fake-tree tests here check, through
the binary the harness really runs, the cases the harness's own parser used to be tested on.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.idle import IdleCounters, IdleEntryReader, IdleSourceError, idle_rates, parse_reading

REPO = Path(__file__).resolve().parents[2]

# Speaks gleaner's side: a reading on start and per stdin line; counts grow by 5 and 3.
# FAKE_SOURCE picks the source; FAKE_FAIL makes it fail the way an old gleaner does.
FAKE_GLEANER = """#!{python}
import json, os, sys
if os.environ.get("FAKE_FAIL"):
    sys.stderr.write("error: unrecognized subcommand '__idle-entries'\\n")
    sys.exit(2)
assert sys.argv[1:] == ["__idle-entries"], sys.argv
source = os.environ.get("FAKE_SOURCE", "tracepoint")
n = 0
while True:
    print(json.dumps({{"source": source, "exact": True, "per_cpu": {{"0": 5 * n, "1": 3 * n}}}}), flush=True)
    if not sys.stdin.readline():
        break
    n += 1
"""


@pytest.fixture
def fake_gleaner(tmp_path):
    path = tmp_path / "gleaner"
    path.write_text(FAKE_GLEANER.format(python=sys.executable))
    path.chmod(0o755)
    return path


def test_readings_are_cumulative_and_keep_their_source(fake_gleaner):
    reader = IdleEntryReader(fake_gleaner)
    try:
        assert reader.source == "tracepoint"
        assert reader.read() == IdleCounters("tracepoint", {0: 5, 1: 3})
        assert reader.read() == IdleCounters("tracepoint", {0: 10, 1: 6})
    finally:
        reader.close()
    assert reader.process.returncode == 0  # it ends when its stdin closes


def test_no_source_is_an_error_naming_what_was_tried(fake_gleaner, monkeypatch):
    monkeypatch.setenv("FAKE_SOURCE", "unavailable")
    with pytest.raises(IdleSourceError, match="no idle-entry source") as error:
        IdleEntryReader(fake_gleaner)
    assert "cpuidle" in str(error.value) and "timer_list" in str(error.value)


def test_a_gleaner_without_the_subcommand_is_an_error_with_its_message(fake_gleaner, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "1")
    with pytest.raises(IdleSourceError, match="unrecognized subcommand"):
        IdleEntryReader(fake_gleaner)


def test_a_missing_binary_is_an_error(tmp_path):
    with pytest.raises(IdleSourceError, match="cannot start"):
        IdleEntryReader(tmp_path / "absent")


def test_parse_reading_refuses_malformed_lines():
    assert parse_reading('{"source": "cpuidle", "per_cpu": {"1": 4}}') == IdleCounters("cpuidle", {1: 4})
    for bad in ("", "{oops", '{"source": "cpuidle"}', '{"source": 3, "per_cpu": {}}', '{"source": "x", "per_cpu": {"a": 1}}'):
        with pytest.raises(IdleSourceError, match="__idle-entries"):
            parse_reading(bad)


def test_idle_rates_per_second():
    before = IdleCounters("timer-list", {0: 100, 1: 50})
    after = IdleCounters("timer-list", {0: 300, 1: 50})
    assert idle_rates(before, after, 2.0) == {0: 100.0, 1: 0.0}
    with pytest.raises(ValueError, match="positive"):
        idle_rates(before, after, 0.0)
    with pytest.raises(ValueError, match="differ"):
        idle_rates(before, IdleCounters("cpuidle", {0: 1}), 1.0)


# --------------------------------------------------------------------------- the real parser

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
  .iowait_sleeptime: 0 nsecs

Tick Device: mode:     1
Per CPU device: 0
Clock Event Device: lapic-deadline
"""


def real_gleaner():
    """The workspace's debug build, when it has the reader (`cargo build -p gleaner`)."""
    exe = Path(os.environ.get("GLEANER_BIN", REPO / "target/debug/gleaner"))
    if not exe.is_file():
        pytest.skip(f"{exe} not built: run `cargo build -p gleaner`")
    return exe


def fake_tree(tmp_path, cpuidle_usage=None, timer_list=None, interrupts=None):
    """A /sys and /proc with two online CPUs and the given sources; returns their roots."""
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    cpu_root = sys_root / "devices/system/cpu"
    (cpu_root / "cpufreq").mkdir(parents=True)  # non-cpuN entries are ignored
    (cpu_root / "online").write_text("0-1\n")
    for cpu in (0, 1):
        (cpu_root / f"cpu{cpu}").mkdir()  # no cpuidle dir, like driver "none"
    for cpu, states in (cpuidle_usage or {}).items():
        for index, count in enumerate(states):
            state = cpu_root / f"cpu{cpu}" / "cpuidle" / f"state{index}"
            state.mkdir(parents=True)
            (state / "usage").write_text(f"{count}\n")
            (state / "time").write_text("1000\n")  # every kernel state has both
    proc_root.mkdir()
    if timer_list is not None:
        (proc_root / "timer_list").write_text(timer_list)
    if interrupts is not None:
        (proc_root / "interrupts").write_text(interrupts)
    return sys_root, proc_root


def first_reading(exe, sys_root, proc_root):
    done = subprocess.run([str(exe), "__idle-entries", "--sys-root", str(sys_root), "--proc-root", str(proc_root)],
                          input="", capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return parse_reading(done.stdout.splitlines()[0])


def test_real_reader_prefers_cpuidle_and_sums_its_states(tmp_path):
    roots = fake_tree(tmp_path, cpuidle_usage={0: [10, 5], 1: [7]}, timer_list=TIMER_LIST)
    assert first_reading(real_gleaner(), *roots) == IdleCounters("cpuidle", {0: 15, 1: 7})


def test_real_reader_falls_back_to_timer_list_without_cpuidle_states(tmp_path):
    roots = fake_tree(tmp_path, timer_list=TIMER_LIST)
    assert first_reading(real_gleaner(), *roots) == IdleCounters("timer-list-and-wake-interrupts", {0: 7232, 1: 5288})


def test_real_reader_falls_back_to_wake_up_interrupts(tmp_path):
    # The fallback the harness's own parser lacked.
    interrupts = (
        "           CPU0       CPU1\n  RES:       2907       5804   Rescheduling interrupts\n"
        "  CAL:         10         20   Function call interrupts\n"
    )
    roots = fake_tree(tmp_path, interrupts=interrupts)
    assert first_reading(real_gleaner(), *roots) == IdleCounters("wake-interrupts", {0: 2917, 1: 5824})


def test_real_reader_without_any_source_says_unavailable(tmp_path):
    roots = fake_tree(tmp_path)
    assert first_reading(real_gleaner(), *roots).source == "unavailable"
