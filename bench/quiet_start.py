#!/usr/bin/env python3
"""A program that starts quietly and then turns busy, under two builds of Gleaner: how soon
each packs a ping-pong after it turns busy, what grain (g_comp) it measured in the busy
periods, and the round trips/s the workload made. Writes results/quiet-start-DATE.{json,md}.

Most real programs start this way (a database loads, a server waits for its first clients),
and the BPF sampler measures a quiet period whole but a busy one in short windows that later
periods reuse: which window a period stands on decides the grain the policy acts on. The
workload is `sh -c "sleep S; exec gleaner workload pingpong --duration D --json"`; the
configurations, interleaved (the order rotates every round): the program as is (baseline),
`taskset -c 0` (the best fixed setting on a 2-vCPU guest), and `gleaner run` of each build.

    python3 bench/quiet_start.py --gleaner target/release/gleaner --against OLD_BUILD --reps 12
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.preflight import load_check, machine_facts, read_loadavg  # noqa: E402
from harness.report import finish_markdown, paired_pairs, summary_row  # noqa: E402

CONFIGS = ("baseline", "one-vcpu", "gleaner", "against")


def command(config: str, builds: dict[str, str], sleep_s: float, duration_s: float,
            timeline: Path) -> list[str]:
    # The workload is the same binary's for every configuration: only the manager differs.
    work = f"sleep {sleep_s}; exec {builds['gleaner']} workload pingpong --duration {duration_s} --json"
    program = ["sh", "-c", work]
    if config == "baseline":
        return program
    if config == "one-vcpu":
        return ["taskset", "-c", "0", *program]
    return [builds[config], "run", "--timeline", str(timeline), "--", *program]


def timeline_facts(timeline: Path, sleep_s: float) -> dict:
    """From a run's timeline: when the first consolidation came after the workload turned
    busy (s), the largest g_comp of the busy periods before the last (ns), whether the run
    ended on one vCPU, and the events of every kind."""
    lines = []
    for raw in timeline.read_text().splitlines():
        try:
            lines.append(json.loads(raw))
        except json.JSONDecodeError:
            continue
    first_pack = None
    kinds: dict[str, int] = {}
    for line in lines:
        for event in line.get("events", []):
            kinds[event.get("kind", "?")] = kinds.get(event.get("kind", "?"), 0) + 1
            if event.get("kind") == "deactivate" and first_pack is None:
                first_pack = line["t_s"] - sleep_s
    busy = [line["characteristics"] for line in lines
            if line["t_s"] > sleep_s and line["characteristics"].get("total_util", 0) >= 0.5]
    grains = [c.get("g_comp_ns", 0.0) for c in busy[1:-1]]
    active = lines[-1].get("active", "") if lines else ""
    return {"first_pack_s": first_pack, "max_busy_g_comp_ns": max(grains, default=None),
            "packed_at_end": isinstance(active, str) and "," not in active and "-" not in active,
            "events": kinds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gleaner", default="target/release/gleaner", help="the build under test")
    ap.add_argument("--against", required=True, help="the build to compare with (an older commit's)")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--sleep", type=float, default=0.4, help="seconds the program is quiet first")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds of ping-pong after")
    ap.add_argument("--out-dir", default="results")
    args = ap.parse_args()
    if args.reps < 2:
        print("quiet_start: --reps must be at least 2 (paired ratios need rounds)", file=sys.stderr)
        return 2
    for build in (args.gleaner, args.against):
        if not Path(build).exists():
            print(f"quiet_start: {build} not found: build it with `cargo build --release -p gleaner`",
                  file=sys.stderr)
            return 2
    builds = {"gleaner": args.gleaner, "against": args.against}
    facts = machine_facts()
    warning = load_check(read_loadavg())
    if warning:
        print(f"quiet_start: {warning}", file=sys.stderr)
    values: dict[str, dict[int, float]] = {c: {} for c in CONFIGS}
    runs: dict[str, list[dict]] = {"gleaner": [], "against": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            order = CONFIGS[rep % len(CONFIGS):] + CONFIGS[:rep % len(CONFIGS)]
            for config in order:
                timeline = Path(tmp) / f"timeline-{config}-{rep}.jsonl"
                out = subprocess.run(command(config, builds, args.sleep, args.duration, timeline),
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    print(f"quiet_start: {config} round {rep} failed: {out.stderr.strip()[-300:]}",
                          file=sys.stderr)
                    continue
                values[config][rep] = json.loads(out.stdout.strip().splitlines()[-1])["throughput_per_s"]
                if config in runs:
                    runs[config].append({"rep": rep, **timeline_facts(timeline, args.sleep)})
            print(f"round {rep + 1}/{args.reps}: " + ", ".join(
                f"{c} {values[c].get(rep, float('nan')):.0f}" for c in CONFIGS), file=sys.stderr)
    summary = {c: {"median": statistics.median(v.values()), "min": min(v.values()),
                   "max": max(v.values()), "n": len(v)} for c, v in values.items() if v}
    pairs = paired_pairs(values, [("gleaner", "against"), ("gleaner", "one-vcpu"), ("against", "one-vcpu"),
                                  ("gleaner", "baseline"), ("against", "baseline")])
    stamp = time.strftime("%Y-%m-%d-%H%M%S", time.gmtime())
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"machine": facts, "load_warning": warning, "builds": builds, "sleep_s": args.sleep,
            "duration_s": args.duration, "reps": args.reps, "values": values, "summary": summary,
            "paired": pairs, "runs": runs}
    (out_dir / f"quiet-start-{stamp}.json").write_text(json.dumps(data, indent=1))

    def median_of(config: str, key: str) -> str:
        xs = [r[key] for r in runs[config] if r[key] is not None]
        if not xs:
            return "—"
        return f"{statistics.median(xs):.3g} ({min(xs):.3g}–{max(xs):.3g})"

    md = [f"# A program that starts quietly: ping-pong after {args.sleep} s of sleep ({stamp} UTC)", "",
          f"Commit {facts['commit'][:10]}, cpuidle driver `{facts['cpuidle_driver']}`, kernel "
          f"{facts['kernel']}, load at the start {facts['loadavg']}"
          + (f" (**{warning}**)" if warning else "") + f"; {args.reps} interleaved rounds; "
          f"`gleaner` = `{args.gleaner}`, `against` = `{args.against}`.", "",
          f"    python3 bench/quiet_start.py --gleaner {args.gleaner} --against {args.against} "
          f"--reps {args.reps} --sleep {args.sleep} --duration {args.duration}", "",
          "| configuration | round trips/s, median (min–max) | packed after turning busy, s | largest busy g_comp, ns | runs ending on one vCPU |",
          "|---|---|---|---|---|"]
    for c in CONFIGS:
        s = summary.get(c)
        if not s:
            continue
        if c in runs:
            rest = (f"{median_of(c, 'first_pack_s')} | {median_of(c, 'max_busy_g_comp_ns')} | "
                    f"{sum(r['packed_at_end'] for r in runs[c])} of {len(runs[c])}")
        else:
            rest = "— | — | —"
        md.append(summary_row(c, s, rest))
    finish_markdown(out_dir / f"quiet-start-{stamp}.md", md, pairs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
