"""Pooling batches: pairs kept across files, batches of another guest kind or under load left
out by name, and bad input answered with one line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import pool
from harness.stats import ratio_summary

POOL = Path(__file__).resolve().parent.parent / "pool.py"


def run(config, rep, value, ok=True):
    return {"config": config, "rep": rep, "ok": ok, "value": value}


def results(driver="haltpoll", load=0.1, warning=None, commit="abcdef0123", higher=True, runs=None):
    return {
        "host": {"cpuidle_driver": driver, "commit": commit},
        "load": {"before": [load, 0.0, 0.0], "warning": warning},
        "workloads": [{"name": "sysbench-threads", "higher_is_better": higher, "error": None, "runs": runs or []}],
    }


def test_pairs_stay_within_their_round_and_batch():
    # Batch a: Gleaner 0.9 and 1.0 of its rounds' baselines; batch b: 0.95, and a failed run.
    a = pool.batch_of("a.json", results(runs=[run("baseline", 0, 100.0), run("gleaner", 0, 90.0),
                                              run("baseline", 1, 200.0), run("gleaner", 1, 200.0)]))
    b = pool.batch_of("b.json", results(runs=[run("baseline", 0, 20.0), run("gleaner", 0, 19.0),
                                              run("baseline", 1, 20.0), run("gleaner", 1, 0.0, ok=False)]))
    pooled = pool.pool([a, b], driver=None, include_busy=False)
    assert sorted(pooled.ratios[("sysbench-threads", "gleaner")]) == pytest.approx([0.9, 0.95, 1.0])
    assert ratio_summary(pooled.ratios[("sysbench-threads", "gleaner")]).median == pytest.approx(0.95)
    assert [(name, n.n) for name, _, _, n in pooled.per_batch] == [("a.json", 2), ("b.json", 1)]
    text = pool.markdown(pooled, None)
    assert "| sysbench-threads | ×0.950 [" in text and "(3) |" in text
    assert "Pooled over 2 batch(es): a.json (abcdef0, load 0.10), b.json (abcdef0, load 0.10)." in text


def test_a_time_is_better_when_lower():
    timed = pool.batch_of("t.json", results(higher=False, runs=[run("baseline", 0, 2.0), run("gleaner", 0, 1.0)]))
    assert pool.pool([timed], None, False).ratios[("sysbench-threads", "gleaner")] == [2.0]


def test_other_guest_kinds_and_busy_batches_are_left_out_by_name():
    rows = [run("baseline", 0, 100.0), run("gleaner", 0, 90.0)]
    batches = [pool.batch_of("hp.json", results(runs=rows)),
               pool.batch_of("none.json", results(driver="none", runs=rows)),
               pool.batch_of("busy.json", results(load=2.4, warning="busy", runs=rows))]
    pooled = pool.pool(batches, driver=None, include_busy=False)
    assert [b.name for b in pooled.used] == ["hp.json"]
    assert pooled.skipped == [("none.json", "cpuidle driver none, not haltpoll"),
                              ("busy.json", "load warning (1-minute load 2.40 at the start)")]
    assert "Left out: busy.json: load warning" in pool.markdown(pooled, ["gleaner"])
    assert [b.name for b in pool.pool(batches, "haltpoll", include_busy=True).used] == ["hp.json", "busy.json"]
    assert [b.name for b in pool.pool(batches, "none", include_busy=False).used] == ["none.json"]


def test_a_file_that_is_not_a_results_file_is_named():
    with pytest.raises(pool.PoolError, match=r"^x.json: not a results file of bench/run.py \(missing or bad 'host'\)"):
        pool.batch_of("x.json", {"suite": "daemon"})


def cli(*args):
    return subprocess.run([sys.executable, str(POOL), *map(str, args)], capture_output=True, text=True)


def test_the_command_pools_files_and_answers_bad_input_in_one_line(tmp_path):
    good = tmp_path / "daemon-1.json"
    good.write_text(json.dumps(results(runs=[run("baseline", 0, 100.0), run("gleaner", 0, 97.0)])))
    done = cli(good)
    assert done.returncode == 0 and "| sysbench-threads | ×0.970 [0.970, 0.970] (1) |" in done.stdout

    broken = tmp_path / "broken.json"
    broken.write_text("{")
    for bad, code, message in [
        (broken, 2, "is not JSON"),
        (tmp_path / "missing.json", 2, "cannot read"),
    ]:
        done = cli(good, bad)
        assert done.returncode == code
        assert done.stderr.count("\n") == 1 and message in done.stderr and "Traceback" not in done.stderr

    done = cli("--driver", "none", good)
    assert done.returncode == 1 and "no batch left to pool" in done.stderr and done.stderr.count("\n") == 1


def test_runs_pair_with_another_configuration_of_their_round(tmp_path):
    rows = [run("baseline", 0, 100.0), run("gleaner", 0, 380.0), run("one-vcpu", 0, 400.0),
            run("baseline", 1, 100.0), run("gleaner", 1, 300.0), run("one-vcpu", 1, 300.0)]
    batch = pool.batch_of("p.json", results(runs=rows))
    pooled = pool.pool([batch], None, False, against="one-vcpu")
    assert sorted(pooled.ratios[("sysbench-threads", "gleaner")]) == pytest.approx([0.95, 1.0])
    assert ("sysbench-threads", "one-vcpu") not in pooled.ratios
    assert "| workload | baseline vs one-vcpu | gleaner vs one-vcpu |" in pool.markdown(pooled, None)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(results(runs=rows)))
    done = cli(path, "--against", "one-vcpu", "--configs", "gleaner")
    assert done.returncode == 0 and "| sysbench-threads | ×0.975 [" in done.stdout
    done = cli(path, "--against", "yield-loop")
    assert done.returncode == 1 and "no round has both yield-loop" in done.stderr and done.stderr.count("\n") == 1
