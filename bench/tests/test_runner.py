"""A whole suite through the runner, against a fake gleaner CLI and a fake haltpoll file.

The fake `gleaner` is a small Python script that understands `run [--timeline T]
[--mode M] -- CMD`, `probe --json` and `workload pipeline ... --json`, so the test
checks the real wiring (interleaving, timeline capture, haltpoll write/restore,
output files) in about a second, without root or any installed benchmark tool.
"""

import json
import stat
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")  # run_suite draws the plots at the end

from harness import runner  # noqa: E402
from harness.cleanup import CleanupStack
from harness.configs import select_configs
from harness.haltpoll import HaltpollStatus
from harness.suites import Suite
from harness.workloads import CommandWorkload, WorkloadError

FAKE_GLEANER = textwrap.dedent(
    """\
    #!{python}
    import json, os, sys
    args = sys.argv[1:]
    if args[0] == "probe":
        print(json.dumps({{"points": [{{"setting": "halted", "gap_ns": 1000,
                          "latency": {{"min_ns": 1, "p50_ns": 2, "p99_ns": 3, "max_ns": 4}}}}]}}))
    elif args[0] == "workload":
        print("log line on stdout")
        print(json.dumps({{"workload": args[1], "throughput_per_s": 42.0}}))
    elif args[0] == "run":
        split = args.index("--")
        options, command = args[1:split], args[split + 1:]
        if "--timeline" in options:
            with open(options[options.index("--timeline") + 1], "w") as timeline:
                for i, active in enumerate(["0-1", "0", "0"]):
                    timeline.write(json.dumps({{"t_s": i * 0.1, "active": active,
                                               "n_active": 2 if active == "0-1" else 1, "rho": 0.1}}) + "\\n")
        os.execvp(command[0], command)
    else:
        sys.exit(2)
    """
)


@pytest.fixture
def fake_gleaner(tmp_path):
    path = tmp_path / "gleaner"
    path.write_text(FAKE_GLEANER.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_suite_end_to_end(tmp_path, fake_gleaner):
    param = tmp_path / "guest_halt_poll_ns"
    param.write_text("50000\n")
    # The metric is the haltpoll parameter as the workload sees it while it runs.
    reader = CommandWorkload(
        "read-param", "prints the haltpoll parameter", "param", "ns", True, 0.1, (),
        argv=[sys.executable, "-c", f"print(open({str(param)!r}).read().strip())"],
        metric_of=lambda output, _wall: float(output.split()[-1]),
    )
    suite = Suite("quick", "test", (reader,), reps=2, phase_run=(("fine", 0.2), ("coarse", 0.2)))
    options = runner.Options(
        suite=suite,
        configs=select_configs(["baseline", "gleaner", "haltpoll"]),
        reps=2,
        gleaner=fake_gleaner,
        results_dir=tmp_path / "results",
        haltpoll=HaltpollStatus(True, False, "none", "cpuidle driver is 'none'"),
        haltpoll_anyway=True,
        haltpoll_param=param,
        haltpoll_journal=tmp_path / "journal",
    )
    # A record a killed run left in the test's own journal is restored at the suite's start;
    # the machine's journal (/run/gleaner-bench) is never read or written by a test.
    (tmp_path / "journal").mkdir()
    (tmp_path / "journal" / "stale.json").write_text(
        json.dumps({"path": str(param), "old_value": "50000", "pid": 2**22 + 1})
    )
    param.write_text("123\n")
    stack = CleanupStack()
    written = runner.run_suite(options, stack)

    assert stack.pending() == []
    assert param.read_text().strip() == "50000"
    assert list((tmp_path / "journal").iterdir()) == [], "every record of the run was removed"
    names = {path.name for path in written}
    stem = written[0].stem
    assert {f"{stem}.json", f"{stem}.md", f"{stem}-speedup.png", f"{stem}-wake-latency-cdf.png",
            f"{stem}-active-vcpus.png"} <= names
    results = json.loads(written[0].read_text())
    runs = results["workloads"][0]["runs"]
    assert [(run["rep"], run["config"]) for run in runs] == [
        (0, "baseline"), (0, "gleaner"), (0, "haltpoll"), (1, "gleaner"), (1, "haltpoll"), (1, "baseline")]
    assert results["run_order"] == "balanced"
    assert all(run["ok"] for run in runs), [run["error"] for run in runs]
    assert {run["config"]: run["value"] for run in runs} == {"baseline": 50000, "gleaner": 50000, "haltpoll": 200000}
    assert runs[1]["timeline"][1] == {"t_s": 0.1, "active": "0", "n_active": 1}
    assert runs[0]["timeline"] is None
    assert results["phase_run"]["report"]["throughput_per_s"] == 42.0
    assert len(results["phase_run"]["timeline"]) == 3
    assert results["probe"]["result"]["points"][0]["setting"] == "halted"
    haltpoll = next(config for config in results["configs"] if config["name"] == "haltpoll")
    assert haltpoll["status"] == "ran" and "INEFFECTIVE" in haltpoll["description"]
    assert "×4.00" in written[1].read_text()  # haltpoll's 200000 over baseline's 50000


def test_failed_runs_are_recorded_not_raised(tmp_path):
    failing = CommandWorkload(
        "fails", "exits 3", "x", "x", True, 0.1, (),
        argv=[sys.executable, "-c", "import sys; print('oops'); sys.exit(3)"],
        metric_of=lambda output, _wall: 1.0,
    )
    options = runner.Options(
        suite=Suite("quick", "test", (failing,), reps=1, phase_run=()),
        configs=select_configs(["baseline"]),
        reps=1,
        gleaner=tmp_path / "absent",
        results_dir=tmp_path / "results",
        haltpoll=HaltpollStatus(False, False, "none", "no module"),
    )
    written = runner.run_suite(options, CleanupStack())
    results = json.loads(written[0].read_text())
    run = results["workloads"][0]["runs"][0]
    assert not run["ok"] and run["error"] == "exit status 3: oops"
    assert "failed (1 runs)" in written[1].read_text()


def test_haltpoll_statuses():
    base = dict(suite=None, configs=select_configs(["baseline", "haltpoll"]), reps=1,
                gleaner=Path("g"), results_dir=Path("r"))
    ineffective = HaltpollStatus(True, False, "none", "driver none")
    runnable, records = runner.config_statuses(runner.Options(haltpoll=ineffective, **base))
    assert [c.name for c in runnable] == ["baseline"]
    assert records[1]["status"] == "skipped" and "--haltpoll-anyway" in records[1]["reason"]
    missing = HaltpollStatus(False, False, "none", "no module")
    runnable, records = runner.config_statuses(runner.Options(haltpoll=missing, haltpoll_anyway=True, **base))
    assert [c.name for c in runnable] == ["baseline"] and records[1]["reason"] == "no module"
    effective = HaltpollStatus(True, True, "haltpoll", "ok")
    runnable, _ = runner.config_statuses(runner.Options(haltpoll=effective, **base))
    assert [c.name for c in runnable] == ["baseline", "haltpoll"]


def test_output_stem_adds_time_when_taken(tmp_path):
    import datetime

    now = datetime.datetime(2026, 1, 2, 3, 4, 5)
    first = runner.output_stem(tmp_path, "quick", now)
    assert first.name == "quick-2026-01-02"
    first.with_suffix(".json").write_text("{}")
    assert runner.output_stem(tmp_path, "quick", now).name == "quick-2026-01-02-030405"


class BrokenSetup(CommandWorkload):
    """prepare() fails half-way; teardown() must still run."""

    torn_down = False

    def prepare(self, ctx):
        raise WorkloadError("no input file")

    def teardown(self, ctx):
        BrokenSetup.torn_down = True


def test_setup_failure_is_recorded_and_torn_down(tmp_path):
    broken = BrokenSetup("broken", "d", "x", "x", True, 0.1, (), argv=["true"], metric_of=lambda _o, _w: 1.0)
    options = runner.Options(
        suite=Suite("quick", "test", (broken,), reps=1, phase_run=()),
        configs=select_configs(["baseline"]),
        reps=1,
        gleaner=tmp_path / "absent",
        results_dir=tmp_path / "results",
        haltpoll=HaltpollStatus(False, False, "none", "no module"),
    )
    written = runner.run_suite(options, CleanupStack())
    results = json.loads(written[0].read_text())
    assert results["workloads"][0]["error"] == "setup failed: no input file"
    assert results["workloads"][0]["runs"] == []
    assert BrokenSetup.torn_down
    assert "not run: setup failed: no input file" in written[1].read_text()
