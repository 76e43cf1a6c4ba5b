"""bench/perturbation.py: its settings parse or fail with a message, and the waker wrapper
runs the workload, keeps its exit status and stops the waker, also when it is killed."""

import signal
import subprocess
import time
from pathlib import Path

import pytest

import perturbation


def test_wakers_parse_period_spin_and_policy():
    assert perturbation.parse_wakers("100:0,1000:300:idle") == [
        ("waker 100 ms, spin 0 µs", 100, 0, None),
        ("waker 1000 ms, spin 300 µs, SCHED_IDLE", 1000, 300, "idle"),
    ]


def test_a_waker_may_run_at_a_nice_value():
    assert perturbation.parse_wakers("100:300:nice=-10") == [("waker 100 ms, spin 300 µs, nice=-10", 100, 300, "nice=-10")]
    assert perturbation.beside_waker(Path("/w"), 100, 300, "nice=-10", ["true"])[2].startswith("nice -n -10 /w 100 300 &")


@pytest.mark.parametrize("bad", ["100", "x:0", "100:0:fifo", "100:-1", "100:0:nice=x"])
def test_a_bad_waker_is_one_line_naming_the_form(bad):
    with pytest.raises(SystemExit, match="PERIOD_MS:SPIN_US"):
        perturbation.parse_wakers(bad)


def test_the_waker_runs_beside_the_workload_and_is_stopped(tmp_path):
    waker = perturbation.build_waker(tmp_path)
    cmd = perturbation.beside_waker(waker, 10, 0, None, ["sh", "-c", "sleep 0.1; exit 3"])
    assert subprocess.run(cmd, timeout=10).returncode == 3
    # The waker was stopped: no process of that executable is left.
    left = subprocess.run(["pgrep", "-f", str(waker)], capture_output=True, text=True).stdout
    assert left.strip() == ""


def test_a_waker_does_not_outlive_a_killed_wrapper(tmp_path):
    # Ctrl-C or a kill of the benchmark must not leave a waker spinning on the machine.
    waker = perturbation.build_waker(tmp_path)
    shell = subprocess.Popen(perturbation.beside_waker(waker, 10, 0, None, ["sleep", "30"]))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not _running(waker):
        time.sleep(0.02)
    assert _running(waker)
    children = subprocess.run(["pgrep", "-P", str(shell.pid)], capture_output=True, text=True).stdout.split()
    shell.send_signal(signal.SIGKILL)
    shell.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _running(waker):
        time.sleep(0.02)
    survived = _running(waker)
    for pid in children:  # the orphaned `sleep`, and the waker if the test failed
        subprocess.run(["kill", pid], check=False, capture_output=True)
    assert not survived


def _running(exe):
    return subprocess.run(["pgrep", "-f", str(exe)], capture_output=True).returncode == 0
