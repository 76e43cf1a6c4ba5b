#!/usr/bin/env python3
"""Gleaner judging by the application's own progress counter against judging by utilization
(issue 16: "let the user give it ... and judge by it"), on the ping-pong, whose packing onto
one vCPU is the change Gleaner makes on a 2-vCPU guest. Writes results/progress-judge-DATE.{json,md}.

Configurations, interleaved (the order rotates every round): the program as is (baseline),
`gleaner run` (judged by utilization), `gleaner run --progress-file F` (judged by the round
trips the workload writes to F every 1,024 rounds, `gleaner workload pingpong --count-file F`),
`gleaner run --progress-url URL --progress-metric M` (the same count served as a Prometheus
counter on loopback by a thread of this script, as an application's exporter would), and
`taskset -c 0` (the best fixed setting on this guest). Every configuration runs the
workload with the count file, so the writes cost all of them alike. Reported: each one's
round trips/s (median, min-max) and the paired ratios of both Gleaners against one vCPU and of
the progress-judged one against the utilization-judged one (median with its 95 % bootstrap
interval), and how many runs ended packed on one vCPU (from the timelines).

    python3 bench/progress_judge.py --gleaner target/release/gleaner --reps 12
"""

from __future__ import annotations

import argparse
import http.server
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.preflight import load_check, machine_facts, read_loadavg  # noqa: E402
from harness.report import finish_markdown, paired_pairs, summary_row  # noqa: E402

CONFIGS = ("baseline", "gleaner", "gleaner-progress", "gleaner-metric", "one-vcpu")
METRIC = "pingpong_round_trips_total"


class Exporter:
    """A Prometheus page on loopback whose one counter is the current count file's number,
    as an application's exporter would serve it (`gleaner-metric` reads it with
    `--progress-url`). A thread of this process; it wakes only when asked."""

    def __init__(self) -> None:
        self.count: Path | None = None
        exporter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                try:
                    n = int(exporter.count.read_text().split()[0]) if exporter.count else 0
                except (OSError, ValueError, IndexError):
                    n = 0
                body = f"# TYPE {METRIC} counter\n{METRIC} {n}\n".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def command(config: str, gleaner: str, count: Path, timeline: Path, rounds: int,
            url: str = "") -> list[str]:
    work = [gleaner, "workload", "pingpong", "--json", "--rounds", str(rounds), "--count-file", str(count)]
    if config == "baseline":
        return work
    if config == "one-vcpu":
        return ["taskset", "-c", "0", *work]
    run = [gleaner, "run", "--timeline", str(timeline)]
    if config == "gleaner-progress":
        run += ["--progress-file", str(count)]
    if config == "gleaner-metric":
        run += ["--progress-url", url, "--progress-metric", METRIC]
    return [*run, "--", *work]


def packed(timeline: Path) -> bool:
    """Whether the run's last period had one active vCPU."""
    try:
        lines = timeline.read_text().splitlines()
    except OSError:
        return False
    for line in reversed(lines):
        try:
            active = json.loads(line).get("active")
        except json.JSONDecodeError:
            continue
        if isinstance(active, str):
            return "," not in active and "-" not in active
        if isinstance(active, list):
            return len(active) == 1
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gleaner", default="target/release/gleaner")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=200_000)
    ap.add_argument("--out-dir", default="results")
    args = ap.parse_args()
    if args.reps < 2:
        print("progress_judge: --reps must be at least 2 (paired ratios need rounds)", file=sys.stderr)
        return 2
    if not Path(args.gleaner).exists():
        print(f"progress_judge: {args.gleaner} not found: build it with `cargo build --release -p gleaner`",
              file=sys.stderr)
        return 2
    facts = machine_facts()
    warning = load_check(read_loadavg())
    if warning:
        print(f"progress_judge: {warning}", file=sys.stderr)
    values: dict[str, dict[int, float]] = {c: {} for c in CONFIGS}
    packs: dict[str, list[bool]] = {c: [] for c in ("gleaner", "gleaner-progress", "gleaner-metric")}
    exporter = Exporter()
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            order = CONFIGS[rep % len(CONFIGS):] + CONFIGS[:rep % len(CONFIGS)]
            for config in order:
                count = Path(tmp) / f"count-{config}"
                timeline = Path(tmp) / f"timeline-{config}-{rep}.jsonl"
                exporter.count = count
                out = subprocess.run(command(config, args.gleaner, count, timeline, args.rounds,
                                             exporter.url),
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    print(f"progress_judge: {config} round {rep} failed: {out.stderr.strip()[-300:]}",
                          file=sys.stderr)
                    continue
                report = json.loads(out.stdout.strip().splitlines()[-1])
                values[config][rep] = report["throughput_per_s"]
                if config in packs:
                    packs[config].append(packed(timeline))
            print(f"round {rep + 1}/{args.reps}: " + ", ".join(
                f"{c} {values[c].get(rep, float('nan')):.0f}" for c in CONFIGS), file=sys.stderr)
    summary = {c: {"median": statistics.median(v.values()), "min": min(v.values()), "max": max(v.values()),
                   "n": len(v)} for c, v in values.items() if v}
    pairs = paired_pairs(values, [
        ("gleaner", "one-vcpu"), ("gleaner-progress", "one-vcpu"), ("gleaner-metric", "one-vcpu"),
        ("gleaner-progress", "gleaner"), ("gleaner-metric", "gleaner"), ("gleaner", "baseline"),
        ("gleaner-progress", "baseline"), ("gleaner-metric", "baseline")])
    stamp = time.strftime("%Y-%m-%d-%H%M%S", time.gmtime())
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"machine": facts, "load_warning": warning, "rounds": args.rounds, "reps": args.reps,
            "values": values, "summary": summary, "paired": pairs,
            "packed": {c: sum(p) for c, p in packs.items()}}
    (out_dir / f"progress-judge-{stamp}.json").write_text(json.dumps(data, indent=1))
    md = [f"# Judged by progress or by utilization: ping-pong ({stamp} UTC)", "",
          f"Commit {facts['commit'][:10]}, cpuidle driver `{facts['cpuidle_driver']}`, kernel "
          f"{facts['kernel']}, load at the start {facts['loadavg']}"
          + (f" (**{warning}**)" if warning else "") + f"; {args.reps} interleaved rounds of "
          f"`gleaner workload pingpong --rounds {args.rounds} --count-file F`.", "",
          f"    python3 bench/progress_judge.py --gleaner {args.gleaner} --reps {args.reps} --rounds {args.rounds}", "",
          "| configuration | round trips/s, median (min–max) | runs ending on one vCPU |", "|---|---|---|"]
    for c in CONFIGS:
        s = summary.get(c)
        if s:
            p = f"{sum(packs[c])} of {len(packs[c])}" if c in packs else "—"
            md.append(summary_row(c, s, p))
    finish_markdown(out_dir / f"progress-judge-{stamp}.md", md, pairs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
