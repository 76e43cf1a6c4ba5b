"""The pure parts of wake_latency_check.py and overhead.py: histogram quantiles, timeline sums,
/proc parsing."""

import datetime
import json
import os
import time

import overhead
import wake_latency_check as wlc


def test_quantile_matches_the_rust_quarter_octave_interpolation():
    # Bucket floors as LatencyHistogram::bucket_floor_ns: 0..3, then four parts per octave.
    assert [wlc.bucket_floor(i) for i in (0, 3, 4, 7, 8, 36, 37, 40)] == [0, 3, 4, 7, 8, 1024, 1280, 2048]
    b = [0] * wlc.NBUCKETS
    b[44] = 90  # [4096, 5120) ns
    b[60] = 10  # [65536, 81920) ns
    p50 = wlc.quantile(b, 0.5)
    # Same formula as LatencyHistogram::quantile_ns: linear inside the bucket.
    assert abs(p50 - (4096 + 1024 * 50 / 90)) < 1e-6
    assert 65536 <= wlc.quantile(b, 0.99) < 81920
    assert wlc.quantile([0] * wlc.NBUCKETS, 0.5) is None


def test_timeline_sum_adds_each_states_buckets_and_skips_periods_without_histograms(tmp_path):
    def period(running, halted):
        h = lambda i: {"buckets": [1 if k == i else 0 for k in range(wlc.NBUCKETS)], "count": 1, "sum_ns": 1 << i}
        empty = {"buckets": [0] * wlc.NBUCKETS, "count": 0, "sum_ns": 0}
        return {"t_s": 0.1, "wake_latency": {"running": h(running), "polling": empty, "halted": h(halted)}}

    lines = [period(10, 15), {"t_s": 0.2, "wake_latency": None}, period(10, 16)]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(l) for l in lines) + "\n")
    sums = wlc.sum_timeline(path)
    assert sums["running"][10] == 2
    assert sums["halted"][15] == 1 and sums["halted"][16] == 1
    assert sum(sums["polling"]) == 0
    # Means are exact: summed latencies over counts, periods without histograms skipped.
    means = wlc.mean_by_state(path)
    assert means["running"] == 1 << 10
    assert means["halted"] == ((1 << 15) + (1 << 16)) / 2
    assert means["polling"] is None


def test_own_cpu_time_is_read_per_thread_in_nanoseconds():
    before = overhead.proc_cpu_s(os.getpid())
    t0 = time.process_time()
    while time.process_time() - t0 < 0.003:  # 3 ms: less than one 10 ms tick
        pass
    after = overhead.proc_cpu_s(os.getpid())
    assert before is not None and after is not None
    # A tick-based reading would often see no change at all here.
    assert 0.002 <= after - before < 1.0, (before, after)
    assert overhead.proc_cpu_s(2**22 + 12345) is None


def test_bpf_stats_of_a_process_without_bpf_programs_are_zero():
    assert overhead.bpf_prog_stats(os.getpid()) == (0, 0)


def test_median_idle_period_skips_periods_without_idle(tmp_path):
    path = tmp_path / "t.jsonl"
    recs = [
        {"characteristics": {"idle_periods_per_sec": 100.0, "l_idle_ns": 30_000.0}},
        {"characteristics": {"idle_periods_per_sec": 0.0, "l_idle_ns": 0.0}},
        {"characteristics": {"idle_periods_per_sec": 50.0, "l_idle_ns": 50_000.0}},
        {"characteristics": {"idle_periods_per_sec": 80.0, "l_idle_ns": 40_000.0}},
    ]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    assert wlc.median_idle_period_ns(path) == 40_000.0
    path.write_text(json.dumps({"characteristics": {}}) + "\n")
    assert wlc.median_idle_period_ns(path) is None


def test_summary_takes_medians_over_repetitions_and_keeps_each_ratios_range():
    def row(live_mean, probe_mean, ratio):
        return {"setting": "halted", "state": "halted", "live_count": 10, "live_p50_ns": 1.0, "live_p99_ns": 2.0,
                "probe_p50_ns": 1.0, "probe_in_kernel_p50_ns": 1.0, "probe_gap_ns": 20_000, "live_median_idle_period_ns": None,
                "crossing_ns": 100, "live_mean_ns": live_mean, "probe_in_kernel_mean_ns": probe_mean, "ratio": ratio,
                "mean_ratio": live_mean / probe_mean, "user_ratio": None}
    reps = [[row(19.0, 16.0, 1.5)], [row(18.0, 19.0, 1.1)], [row(22.0, 24.0, 0.9)]]
    (s,) = wlc.summarize(reps)
    assert s["repetitions"] == 3
    assert s["live_mean_ns"] == 19.0 and s["probe_in_kernel_mean_ns"] == 19.0
    assert s["ratio"] == 1.1 and s["within_20pct"]
    assert s["ratio_range"] == [0.9, 1.5]
    assert s["user_ratio"] is None and s["user_ratio_range"] is None
    assert abs(s["mean_ratio"] - 18.0 / 19.0) < 1e-9 and s["mean_within_20pct"]


def test_interleaved_pairs_alternate_the_order_and_keep_each_side_apart():
    calls = []

    def measure(cmd):
        calls.append(cmd[0])
        return len(calls)

    bare, under = overhead.interleaved_pairs(3, ["bare"], ["gleaner"], measure)
    assert calls == ["bare", "gleaner", "gleaner", "bare", "bare", "gleaner"]
    assert bare == [1, 4, 5]
    assert under == [2, 3, 6]


def test_interleaved_rounds_reverse_the_order_every_other_round():
    calls = []

    def measure(cmd):
        calls.append(cmd[0])
        return cmd[0]

    a, b, c = overhead.interleaved_rounds(2, [["a"], ["b"], ["c"]], measure)
    assert calls == ["a", "b", "c", "c", "b", "a"]
    assert (a, b, c) == (["a", "a"], ["b", "b"], ["c", "c"])


def test_the_null_wrapper_runs_the_workload_and_keeps_its_exit_status():
    import subprocess

    assert subprocess.run(overhead.NULL_WRAPPER + ["true"]).returncode == 0
    assert subprocess.run(overhead.NULL_WRAPPER + ["sh", "-c", "exit 3"]).returncode == 3


def test_the_periodic_null_observer_runs_the_workload_and_keeps_its_exit_status():
    import subprocess
    assert subprocess.run(overhead.PERIODIC_NULL_OBSERVER + ["true"]).returncode == 0
    assert subprocess.run(overhead.PERIODIC_NULL_OBSERVER + ["sh", "-c", "exit 3"]).returncode == 3


def test_the_own_time_wrapper_stamps_the_workload_and_keeps_its_exit_status(tmp_path):
    import subprocess

    stamp = tmp_path / "stamp"
    measure = overhead.timed_with_own_time(stamp)
    wall, own = measure(overhead.own_time_cmd(stamp, ["sleep", "0.2"]))
    # The own time covers the sleep and not much more; the wall time holds it.
    assert 0.19 < own < wall
    assert own < 0.4
    assert subprocess.run(overhead.own_time_cmd(stamp, ["sh", "-c", "exit 3"])).returncode == 3


def test_a_thread_that_exits_keeps_counting_what_it_used():
    import threading

    def spin():
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.05:
            pass
        spun.set()
        done.wait()

    spun, done = threading.Event(), threading.Event()
    seen: dict[int, int] = {}
    t = threading.Thread(target=spin)
    t.start()
    spun.wait()  # the spin is over; the thread waits, alive
    while_alive = overhead.proc_cpu_s(os.getpid(), seen)
    tid = t.native_id
    done.set()
    t.join()
    # join() returns before the kernel has reaped the thread: wait until its task is gone,
    # or the reads below still see it alive (CI, 2026-12-02: both sums equal).
    deadline = time.monotonic() + 5.0
    while os.path.exists(f"/proc/self/task/{tid}") and time.monotonic() < deadline:
        time.sleep(0.01)
    after_exit = overhead.proc_cpu_s(os.getpid(), seen)
    assert while_alive is not None and after_exit is not None
    assert after_exit >= while_alive, (while_alive, after_exit)
    # Without the threads seen before, the exited one's 50 ms are gone.
    assert overhead.proc_cpu_s(os.getpid()) < after_exit - 0.03


def test_a_second_overhead_batch_the_same_day_does_not_overwrite_the_first(tmp_path):
    # overhead.py names its files as the suite harness does (runner.output_stem).
    now = datetime.datetime(2026, 12, 4, 19, 43, 46)
    first = overhead.output_stem(tmp_path, "overhead", now).with_suffix(".json")
    assert first.name == "overhead-2026-12-04.json"
    first.write_text("{}\n")
    second = overhead.output_stem(tmp_path, "overhead", now).with_suffix(".json")
    assert second.name == "overhead-2026-12-04-194346.json"
