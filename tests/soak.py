#!/usr/bin/env python3
"""Soak test: run a phase-changing workload under `gleaner run` for MINUTES, query
`gleaner status` periodically, and report whether gleaner's memory, threads or open files
grow and whether any control period was missed.

Why: a daemon meant to sit beside a production program for weeks must not leak, and its
controller must keep its period however the workload changes phase. Not run in CI (it takes
as long as you ask); `tests/soak.sh 3` is the short validation run.

Figures (printed and written as JSON to --out):
  * VmRSS, thread count and open fds of the gleaner process, sampled every --every seconds,
    first sample after the warm-up vs the last one and the maximum;
  * periods from the --timeline file: how many, mean and max interval, and missed periods
    (an interval longer than twice what the controller planned for it: the configured
    period, or three periods while the workload is idle);
  * the controller's own account from the last status query: missed and discarded periods
    and the latest wake-up after a deadline;
  * status queries made and how many failed or did not list the instance.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gleaner_exe import gleaner_bin


def proc_status(pid):
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("VmRSS", "Threads"):
                out[k] = int(v.split()[0])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    return out


def main():
    ap = argparse.ArgumentParser(description="gleaner soak test")
    ap.add_argument("minutes", type=float)
    ap.add_argument("--every", type=float, default=5.0, help="seconds between status queries")
    ap.add_argument("--period-ms", type=int, default=100)
    ap.add_argument("--phase-s", type=int, default=20, help="length of each workload phase")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    exe = gleaner_bin("soak")
    work = Path(tempfile.mkdtemp(prefix="gleaner-soak-"))
    state, timeline = work / "state", work / "timeline.jsonl"
    total_s = int(args.minutes * 60)
    # Alternate fine- and coarse-grained phases for the whole run (a major change each time).
    n = max(1, total_s // args.phase_s)
    phases = ",".join(f"{'fine' if i % 2 == 0 else 'coarse'}:{args.phase_s}s" for i in range(n))
    cmd = [exe, "run", "--state-dir", str(state), "--period-ms", str(args.period_ms),
           "--retention-timeout-us", "50", "--timeline", str(timeline), "--",
           exe, "workload", "pipeline", "--stages", "2", "--threads-per-stage", "2", "--phases", phases]
    print(f"soak: {args.minutes} min, {n} phases of {args.phase_s} s, period {args.period_ms} ms, "
          f"status every {args.every} s; files in {work}", flush=True)
    log = open(work / "gleaner.log", "w")
    g = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=dict(os.environ, GLEANER_LOG="warn"))
    samples, queries, bad_queries, last_status = [], 0, 0, {}
    start = time.monotonic()
    try:
        while g.poll() is None:
            time.sleep(args.every)
            if g.poll() is not None:
                break
            q = subprocess.run([exe, "status", "--json", "--state-dir", str(state)], capture_output=True, text=True)
            queries += 1
            try:
                statuses = json.loads(q.stdout)["instances"]
                listed = [s["pid"] for s in statuses]
                last_status = next((s for s in statuses if s["pid"] == g.pid), last_status)
            except (ValueError, KeyError, TypeError):
                listed = []
            if q.returncode != 0 or g.pid not in listed:
                bad_queries += 1
            st = proc_status(g.pid)
            if st:
                st["t_s"] = round(time.monotonic() - start, 1)
                # Other load on the machine explains late periods that are not Gleaner's doing.
                st["loadavg1"] = float(Path("/proc/loadavg").read_text().split()[0])
                samples.append(st)
        code = g.wait()
    except KeyboardInterrupt:
        g.terminate()
        code = g.wait()
    log.close()

    times, planned = [], []
    period_s = args.period_ms / 1000
    for line in timeline.read_text().splitlines() if timeline.exists() else []:
        try:
            rec = json.loads(line)
            times.append(rec["t_s"])
            planned.append(rec.get("planned_s", period_s))
        except (ValueError, KeyError):
            pass
    gaps = [b - a for a, b in zip(times, times[1:])]
    late = [(t, g_) for t, g_, p in zip(times[1:], gaps, planned[1:]) if g_ > 2 * p]
    warm = [s for s in samples if s["t_s"] >= 30] or samples
    fig = {
        "minutes": args.minutes,
        "gleaner_exit_code": code,
        "periods": len(times),
        "period_ms_configured": args.period_ms,
        "period_ms_mean": round(1000 * sum(gaps) / len(gaps), 2) if gaps else None,
        "period_ms_max": round(1000 * max(gaps), 2) if gaps else None,
        "idle_stretched_periods": sum(1 for p in planned if p > period_s * 1.5),
        "missed_periods": len(late),
        "late_periods_at_s": [round(t, 1) for t, _ in late][:20],
        "controller_missed_periods": last_status.get("missed_periods"),
        "controller_discarded_periods": last_status.get("disrupted_periods"),
        "controller_max_late_ms": last_status.get("max_late_ms"),
        "controller_nice": last_status.get("controller_nice"),
        "loadavg1_max": max(s["loadavg1"] for s in samples) if samples else None,
        "status_queries": queries,
        "status_queries_failed": bad_queries,
        "rss_kib_first_after_warmup": warm[0]["VmRSS"] if warm else None,
        "rss_kib_last": samples[-1]["VmRSS"] if samples else None,
        "rss_kib_max": max(s["VmRSS"] for s in samples) if samples else None,
        "threads_min_max": [min(s["Threads"] for s in samples), max(s["Threads"] for s in samples)] if samples else None,
        "fds_min_max": [min(s["fds"] for s in samples), max(s["fds"] for s in samples)] if samples else None,
        "samples": len(samples),
    }
    print(json.dumps(fig, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps({"figures": fig, "samples": samples}, indent=2))
    grew = warm and samples and samples[-1]["VmRSS"] > warm[0]["VmRSS"] * 1.10 + 512
    threads_grew = samples and fig["threads_min_max"][0] != fig["threads_min_max"][1]
    ok = code == 0 and not grew and not threads_grew and fig["missed_periods"] == 0 and bad_queries == 0
    print("soak: " + ("PASS" if ok else "FAIL") + f" (log {work / 'gleaner.log'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
