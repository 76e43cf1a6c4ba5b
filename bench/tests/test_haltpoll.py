"""The haltpoll parameter is restored on every exit path; status detection is honest.

All tests use a fake parameter file in a temp dir. The signal and atexit paths run in
a child interpreter, because they end the process.
"""

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.cleanup import CleanupStack
from harness.haltpoll import HaltpollError, ParamOverride, haltpoll_status, restore_stale

BENCH = Path(__file__).resolve().parent.parent


@pytest.fixture
def param(tmp_path):
    path = tmp_path / "guest_halt_poll_ns"
    path.write_text("50000\n")
    return path


def test_override_writes_then_restores(param):
    stack = CleanupStack()
    with ParamOverride(param, "200000", stack, param.parent / "journal") as override:
        assert param.read_text().strip() == "200000"
        assert override.old_value == "50000"
        assert len(stack.pending()) == 1
    assert param.read_text().strip() == "50000"
    assert stack.pending() == []


def test_override_restores_on_exception(param):
    stack = CleanupStack()
    with pytest.raises(RuntimeError):
        with ParamOverride(param, "200000", stack, param.parent / "journal"):
            raise RuntimeError("workload crashed")
    assert param.read_text().strip() == "50000"


def test_stack_drain_restores_and_later_exit_does_not_write_again(param):
    stack = CleanupStack()
    with ParamOverride(param, "200000", stack, param.parent / "journal"):
        stack.run_all()  # what a signal handler does mid-run
        assert param.read_text().strip() == "50000"
        param.write_text("777\n")  # someone else changes it afterwards
    assert param.read_text().strip() == "777"  # the restore ran exactly once


def test_missing_parameter_is_an_error(tmp_path):
    with pytest.raises(HaltpollError, match="cannot read"):
        with ParamOverride(tmp_path / "absent", "1", CleanupStack(), tmp_path / "journal"):
            pass


CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {bench!r})
    from harness.cleanup import STACK
    from harness.haltpoll import ParamOverride
    STACK.install()
    mode = sys.argv[2]
    override = ParamOverride(Path(sys.argv[1]), "200000", STACK, Path(sys.argv[3]))
    if mode == "atexit":
        override.__enter__()   # never exited: only the atexit hook can restore
        print("ready", flush=True)
        sys.exit(0)
    with override:
        print("ready", flush=True)
        time.sleep(30)
    """
)


def run_child(param, mode):
    return subprocess.Popen(
        [sys.executable, "-c", CHILD.format(bench=str(BENCH)), str(param), mode, str(param.parent / "journal")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_restores_and_exits_with_128_plus_signal(param, signum):
    child = run_child(param, "signal")
    assert child.stdout.readline().strip() == "ready"
    assert param.read_text().strip() == "200000"
    child.send_signal(signum)
    assert child.wait(timeout=10) == 128 + signum
    assert param.read_text().strip() == "50000"
    child.stdout.close()
    child.stderr.close()


def test_atexit_restores(param):
    child = run_child(param, "atexit")
    out, _ = child.communicate(timeout=10)
    assert out.strip() == "ready"
    assert child.returncode == 0
    assert param.read_text().strip() == "50000"


def test_status_driver_none_is_runnable_but_ineffective(tmp_path, param):
    driver = tmp_path / "current_driver"
    driver.write_text("none\n")
    status = haltpoll_status(param, driver, is_root=True)
    assert status.runnable and not status.effective
    assert "'none'" in status.reason
    assert status.label().startswith("ineffective")


def test_status_haltpoll_driver_is_effective(tmp_path, param):
    driver = tmp_path / "current_driver"
    driver.write_text("haltpoll\n")
    assert haltpoll_status(param, driver, is_root=True).label() == "effective"


def test_status_without_module_or_root_is_not_runnable(tmp_path, param):
    driver = tmp_path / "current_driver"
    driver.write_text("haltpoll\n")
    assert not haltpoll_status(tmp_path / "absent", driver, is_root=True).runnable
    not_root = haltpoll_status(param, driver, is_root=False)
    assert not not_root.runnable and "root" in not_root.reason
    assert haltpoll_status(param, tmp_path / "no-driver", is_root=True).driver == "missing"


def test_sigkill_leaves_a_record_that_the_next_start_restores(param):
    """SIGKILL runs no handler: the value stays changed until the next harness start."""
    journal = param.parent / "journal"
    child = run_child(param, "signal")
    assert child.stdout.readline().strip() == "ready"
    child.kill()
    child.wait(timeout=10)
    child.stdout.close()
    child.stderr.close()
    assert param.read_text().strip() == "200000"
    assert restore_stale(journal) == [f"{param}=50000"]
    assert param.read_text().strip() == "50000"
    assert list(journal.glob("*.json")) == []


def test_records_are_removed_on_a_normal_restore_and_a_live_owner_is_left_alone(param):
    journal = param.parent / "journal"
    stack = CleanupStack()
    with ParamOverride(param, "200000", stack, journal):
        assert len(list(journal.glob("*.json"))) == 1
    assert list(journal.glob("*.json")) == []
    assert restore_stale(journal) == []
