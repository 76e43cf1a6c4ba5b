"""Self-tests of the kill test's checker (tests/kill_test.py), with a fake gleaner.

Why: the kill test is the proof that SIGKILL of gleaner leaves the workload as it was; a
checker that misses a failure proves nothing. These run without root or cgroups: the fake
gleaner starts the workload (or not) and is killed like the real one, and only the
process-level checks can fire.
"""

import random
import textwrap
import time

import pytest

import kill_test

# `run ... -- CMD...` starts CMD (the kill test's wrapper: sh -c SCRIPT PIDFILE WORKLOAD...)
# unless FAKE_NEVER_STARTS is set, waits until the workload is settled (exited, or its pid
# written), touches $FAKE_READY and sleeps. `workload` sleeps, or exits at once when
# FAKE_WORKLOAD_DIES is set (a workload that dies with, or despite, its manager).
FAKE_GLEANER = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    import os, subprocess, sys, time
    args = sys.argv[1:]
    if args[0] == "run":
        if not os.environ.get("FAKE_NEVER_STARTS"):
            cmd = args[args.index("--") + 1:]
            child = subprocess.Popen(cmd)
            if os.environ.get("FAKE_WORKLOAD_DIES"):
                child.wait()
            else:
                while not os.path.exists(cmd[3]):
                    time.sleep(0.01)
        open(os.environ["FAKE_READY"], "w").close()
        time.sleep(60)
    elif args[0] == "workload":
        if os.environ.get("FAKE_WORKLOAD_DIES"):
            sys.exit(1)
        time.sleep(60)
    """
)


@pytest.fixture
def fake_gleaner(tmp_path, monkeypatch):
    exe = tmp_path / "gleaner"
    exe.write_text(FAKE_GLEANER)
    exe.chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("FAKE_READY", str(tmp_path / "ready"))
    return str(exe), state, tmp_path / "ready"


def run_iteration(exe, state, ready):
    """One `run` iteration, killed once the fake has settled: (problems, live workload pids)."""
    it = kill_test.Iteration(exe, "run", random.Random(1), state, 0)
    it.delay = 0.0
    it.simulate_consolidation = False
    it.start()
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert time.monotonic() < deadline, "the fake gleaner did not get ready in 30 s"
            time.sleep(0.01)
        it.kill()
        bad, workload, _ = it.check()
    finally:
        it.cleanup()
    return bad, workload


def test_a_run_workload_that_died_is_a_failure(fake_gleaner, monkeypatch):
    monkeypatch.setenv("FAKE_WORKLOAD_DIES", "1")
    bad, workload = run_iteration(*fake_gleaner)
    assert workload == []
    assert any("workload died" in problem for problem in bad), bad


def test_a_run_workload_that_survives_passes(fake_gleaner):
    bad, workload = run_iteration(*fake_gleaner)
    assert bad == []
    assert len(workload) == 1


def test_a_kill_before_the_workload_started_passes(fake_gleaner, monkeypatch):
    monkeypatch.setenv("FAKE_NEVER_STARTS", "1")
    bad, workload = run_iteration(*fake_gleaner)
    assert bad == []
    assert workload == []
