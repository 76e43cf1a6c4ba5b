"""Summaries and the Markdown table, built from a hand-made results dictionary."""

import pytest

from harness import report


def run(config, rep, value, idle=None, ok=True, error=None):
    return {"config": config, "rep": rep, "ok": ok, "value": value, "wall_s": 1.0,
            "idle_per_s": idle, "timeline": None, "error": error}


@pytest.fixture
def results():
    workload = {
        "name": "sysbench-threads", "description": "threads", "metric": "events", "unit": "events/s",
        "higher_is_better": True, "error": None,
        "runs": [
            run("baseline", 0, 100.0, {"0": 10.0, "1": 30.0}),
            run("gleaner", 0, 150.0, {"0": 1.0, "1": 3.0}),
            run("baseline", 1, 120.0, {"0": 20.0, "1": 40.0}),
            run("gleaner", 1, 0.0, ok=False, error="exit status 1: boom"),
            run("baseline", 2, 110.0, {"0": 15.0, "1": 35.0}),
            run("gleaner", 2, 165.0, {"0": 2.0, "1": 4.0}),
        ],
    }
    timed = {
        "name": "sysbench-mutex", "description": "mutex", "metric": "total time", "unit": "s",
        "higher_is_better": False, "error": None,
        "runs": [run("baseline", 0, 2.0), run("gleaner", 0, 1.0)],
    }
    broken = {"name": "oltp-c4", "description": "oltp", "metric": "transactions", "unit": "tx/s",
              "higher_is_better": True, "error": "setup failed: no mysql user", "runs": []}
    for entry in (workload, timed, broken):
        entry["summary"] = report.summarise_workload(entry, ["baseline", "gleaner"])
    return {
        "suite": "quick", "started": "2026-01-01T00:00:00", "finished": "2026-01-01T00:05:00", "reps": 3,
        "host": {"nproc": 2, "kernel": "6.18", "cpuidle_driver": "none", "commit": "abc123-dirty"},
        "load": {"before": [0.9, 0.5, 0.2], "threshold": 0.3, "warning": "busy"},
        "idle_source": "timer_list",
        "configs": [
            {"name": "baseline", "description": "as is", "status": "ran", "reason": ""},
            {"name": "gleaner", "description": "gleaner run", "status": "ran", "reason": ""},
            {"name": "haltpoll", "description": "halt poll", "status": "skipped",
             "reason": "cpuidle driver is 'none'", "note": "ineffective"},
        ],
        "workloads": [workload, timed, broken],
        "notes": [],
    }


def test_summary_ignores_failed_runs_and_computes_speedup(results):
    summary = results["workloads"][0]["summary"]
    baseline = summary["baseline"]
    assert (baseline["median"], baseline["min"], baseline["max"]) == (110.0, 100.0, 120.0)
    assert summary["gleaner"]["runs"] == 3 and summary["gleaner"]["ok"] == 2
    assert summary["gleaner"]["median"] == pytest.approx(157.5)
    assert summary["gleaner"]["speedup"] == pytest.approx(157.5 / 110.0)
    assert summary["baseline"]["idle_per_s_per_vcpu"] == pytest.approx(25.0)  # median of 20, 30, 25
    assert summary["gleaner"]["idle_per_s_per_vcpu"] == pytest.approx(2.5)


def test_lower_is_better_speedup(results):
    assert results["workloads"][1]["summary"]["gleaner"]["speedup"] == pytest.approx(2.0)


def test_markdown_table_rows_and_warnings(results):
    text = report.markdown(results)
    assert "| workload | baseline | gleaner |" in text
    assert "| sysbench-threads (events/s ↑) | 110 [100–120] ×1.00 | 158 [150–165] ×1.43 (1 failed) |" in text
    assert "| sysbench-mutex (s ↓) | 2.00 [2.00–2.00] ×1.00 | 1.00 [1.00–1.00] ×2.00 |" in text
    assert "not run: setup failed: no mysql user" in text
    assert "WARNING: 1-minute load average was 0.90" in text
    assert "`haltpoll`: halt poll — **skipped: cpuidle driver is 'none'**" in text
    assert "sysbench-threads / gleaner rep 1: exit status 1: boom" in text
    assert "Only 3 repetition(s)" in text
    assert "| sysbench-threads | 25.0 | 2.50 |" in text
    assert "commit `abc123-dirty`" in text


def test_markdown_quiet_machine_has_no_warning(results):
    results["load"] = {"before": [0.05, 0.1, 0.1], "threshold": 0.3, "warning": None}
    results["reps"] = 5
    text = report.markdown(results)
    assert "WARNING" not in text and "Only" not in text
    assert "1-minute load average before the suite: 0.05." in text


def test_suite_records_the_commit_it_measured():
    from harness import runner

    commit = runner.source_commit()
    # This test runs inside the repository: a 40-hex commit, marked when the tree is dirty.
    assert len(commit.removesuffix("-dirty")) == 40, commit


def test_gleaner_is_judged_against_every_fixed_setting_paired_by_repetition(results):
    text = report.markdown(results)
    assert "| gleaner vs | baseline | targets |" in text
    # Reps 0 and 2 have both runs (rep 1's gleaner run failed): 150/100 and 165/110.
    assert "| sysbench-threads | ×1.50 [1.50, 1.50] | baseline: met; best: baseline |" in text
    assert "| sysbench-mutex | ×2.00 [2.00, 2.00] | baseline: met; best: baseline |" in text
    paired = results["workloads"][0]["summary"]["gleaner"]["paired_speedup"]
    assert paired == {"pairs": 2, "median": 1.5, "low95": 1.5, "high95": 1.5}


def test_target_check_tells_a_shown_loss_from_noise():
    from harness.stats import PairedRatio

    assert report.target_check(PairedRatio(8, 0.99, 0.95, 1.02), 0.97) == "met"
    assert report.target_check(PairedRatio(8, 0.95, 0.93, 0.99), 0.97) == "not met by the median; the interval reaches it"
    assert report.target_check(PairedRatio(8, 0.90, 0.85, 0.94), 0.97) == "**not met**"
    assert report.target_check(None, 0.97) == "no pairs"


def test_best_static_includes_baseline_and_follows_the_metric_direction(results):
    workload = results["workloads"][0]
    workload["runs"].append(run("one-vcpu", 0, 500.0))
    assert report.best_static(workload, ["baseline", "one-vcpu", "gleaner"]) == "one-vcpu"
    timed = results["workloads"][1]
    timed["runs"].append(run("one-vcpu", 0, 3.0))
    assert report.best_static(timed, ["baseline", "one-vcpu"]) == "baseline"


def test_the_control_is_a_yardstick_not_a_setting(results):
    workload = results["workloads"][0]
    # The same command as baseline, run again: 90/100 and 121/110 in reps 0 and 2.
    workload["runs"] += [run("control", 0, 90.0), run("control", 1, 118.0), run("control", 2, 121.0)]
    workload["runs"].append(run("one-vcpu", 0, 50.0))
    assert report.best_static(workload, ["baseline", "one-vcpu", "control", "gleaner"]) == "baseline"
    workload["runs"].append(run("control", 3, 900.0))  # the best median, yet never "best"
    assert report.best_static(workload, ["baseline", "control"]) == "baseline"
    results["configs"].append({"name": "control", "description": "as is again", "status": "ran", "reason": ""})
    for entry in results["workloads"][:2]:
        entry["summary"] = report.summarise_workload(entry, ["baseline", "gleaner", "control"])
    text = report.markdown(results)
    assert "| gleaner vs | baseline | control vs baseline | targets |" in text
    # Control against baseline, paired by repetition: 0.90, 118/120, 1.10; Gleaner as before.
    assert "| sysbench-threads | ×1.50 [1.50, 1.50] | ×0.98 [0.90, 1.10] | baseline: met; best: baseline |" in text
    assert "The control column is the same command as baseline run again" in text
    # A straddling interval points at the tool that narrows it.
    assert "pool this batch with others of the same guest (`python3 bench/pool.py FILES`)" in text


def test_paired_pairs_leave_out_combinations_without_a_pair_and_the_table_prints_them():
    from harness.report import paired_pairs, paired_table

    values = {"a": {0: 2.0, 1: 2.2, 2: 1.8}, "b": {0: 1.0, 1: 1.0, 2: 1.0}, "c": {5: 1.0}}
    pairs = paired_pairs(values, [("a", "b"), ("a", "c")])
    assert list(pairs) == ["a / b"]
    assert pairs["a / b"]["median"] == 2.0 and pairs["a / b"]["n"] == 3
    lines = paired_table(pairs)
    assert lines[0] == "" and lines[-1] == "| a / b | ×2.000 [1.800, 2.200] | 3 |"


def test_the_one_workload_scripts_write_and_print_the_same_report(tmp_path, capsys):
    row = report.summary_row("gleaner", {"median": 1234.4, "min": 999.6, "max": 1500.2}, "0.08 | 3 of 4")
    assert row == "| gleaner | 1234 (1000–1500) | 0.08 | 3 of 4 |"
    pairs = {"gleaner / baseline": {"n": 4, "median": 1.5, "low": 1.2, "high": 1.8}}
    out = tmp_path / "r.md"
    report.finish_markdown(out, ["# title", row], pairs)
    text = out.read_text()
    assert text.endswith("| gleaner / baseline | ×1.500 [1.200, 1.800] | 4 |\n")
    assert text.startswith("# title\n" + row + "\n\n| paired ratio")
    assert capsys.readouterr().out == text
