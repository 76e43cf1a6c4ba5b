#!/usr/bin/env python3
"""What waking periodically costs a workload by itself, next to `gleaner run --observe`.

Each round runs the workload bare, under `gleaner run --observe`, under `gleaner run` with each
set of options given (`--gleaner-configs`), and beside a `waker`
(bench/perturbation/waker.c: sleep PERIOD, spin SPIN, repeat) for each setting given, in an
order that reverses every other round; the workload's own run time is stamped around it
(bench/overhead.py's `own_time_cmd`). The ratios to the bare run separate what waking at a
given rate costs by itself from what Gleaner's own per-period work costs: on `sysbench threads`
(a mutex-and-yield convoy, 8 threads on 2 vCPUs) a waker at Gleaner's rate cost nothing
measurable, spinning 1 ms a wake-up cost 2 %, and Gleaner 3 % in the same rounds
(results/perturbation-2026-11-25.md).

    sudo python3 bench/perturbation.py --rounds 8
    sudo python3 bench/perturbation.py --rounds 8 --workload 'target/release/gleaner workload pipeline --work 500 --items 300000'
    sudo python3 bench/perturbation.py --rounds 8 --wakers '' --gleaner-configs '--mode full;--mode consolidation'

Writes results/perturbation-DATE.{json,md} with the commit, machine and load. Quiet machine only.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.preflight import machine_facts
from overhead import interleaved_rounds, own_time_cmd, timed_with_own_time

SYSBENCH_THREADS = "sysbench threads --threads=8 --thread-locks=2 --events=2000 --time=0 run"
# PERIOD_MS:SPIN_US[:POLICY] items (see `parse_wakers`).
DEFAULT_WAKERS = "100:0,1000:0,100:300,100:1000,100:0:idle"


def build_waker(out_dir: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise SystemExit("perturbation: no C compiler (cc, gcc or clang); install one (apt install gcc)")
    exe = out_dir / "waker"
    src = Path(__file__).resolve().parent / "perturbation" / "waker.c"
    subprocess.run([cc, "-O2", "-o", str(exe), str(src)], check=True)
    return exe


def parse_wakers(spec: str) -> list[tuple[str, int, int, str | None]]:
    """PERIOD_MS:SPIN_US[:POLICY] items; POLICY is `idle` or `batch` (SCHED_IDLE, SCHED_BATCH)
    or `nice=N` (a nice value, e.g. Gleaner's controller's -10)."""
    wakers = []
    for item in filter(None, spec.split(",")):
        parts = item.split(":")
        policy = parts[2] if len(parts) == 3 else None
        nice_ok = policy is not None and policy.startswith("nice=") and policy[5:].lstrip("-").isdigit()
        if (len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[:2])
                or (policy is not None and policy not in ("idle", "batch") and not nice_ok)):
            raise SystemExit(f"perturbation: bad waker '{item}'; write PERIOD_MS:SPIN_US[:idle|batch|nice=N], e.g. 100:0,100:300:nice=-10")
        period, spin = int(parts[0]), int(parts[1])
        label = {"idle": "SCHED_IDLE", "batch": "SCHED_BATCH"}.get(policy, policy)
        name = f"waker {period} ms, spin {spin} µs" + (f", {label}" if policy else "")
        wakers.append((name, period, spin, policy))
    return wakers


def beside_waker(waker: Path, period: int, spin: int, policy: str | None, inner: list[str]) -> list[str]:
    """`inner` run by a shell that starts the waker first and stops it after, keeping the
    workload's exit status."""
    if policy is None:
        prefix = ""
    elif policy.startswith("nice="):
        prefix = f"nice -n {policy[5:]} "
    else:
        prefix = {"idle": "chrt -i 0 ", "batch": "chrt -b 0 "}[policy]
    script = f'{prefix}{waker} {period} {spin} & w=$!; "$@"; rc=$?; kill $w; wait $w 2>/dev/null; exit $rc'
    return ["/bin/sh", "-c", script, "beside-waker", *inner]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gleaner", default="target/release/gleaner")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--workload", default=SYSBENCH_THREADS, help=f"command to time (default: {SYSBENCH_THREADS})")
    ap.add_argument("--gleaner-configs", default="",
                    help="semicolon-separated `gleaner run` options, each a setting of its own "
                         "(e.g. '--observe --sampler procfs;--mode full'); `run --observe` always runs")
    ap.add_argument("--wakers", default=DEFAULT_WAKERS, help="comma-separated PERIOD_MS:SPIN_US[:idle|batch|nice=N] (default %(default)s)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.rounds < 1:
        raise SystemExit("perturbation: --rounds must be at least 1")
    wakers = parse_wakers(args.wakers)
    workload = shlex.split(args.workload)
    if not workload or shutil.which(workload[0]) is None:
        raise SystemExit(f"perturbation: '{workload[0] if workload else ''}' not found; install it or pass --workload")
    gleaner = str(Path(args.gleaner).resolve())
    if not Path(gleaner).is_file():
        raise SystemExit(f"perturbation: no gleaner at {gleaner}; build it (cargo build --release -p gleaner) or pass --gleaner")
    extra = [shlex.split(c) for c in args.gleaner_configs.split(";") if c.strip()]
    names = ["bare", "gleaner run --observe"] + [f"gleaner run {' '.join(c)}" for c in extra] + [w[0] for w in wakers]
    facts = machine_facts()
    with tempfile.TemporaryDirectory(prefix="gleaner-perturbation-") as tmp_dir:
        tmp = Path(tmp_dir)
        waker = build_waker(tmp)
        stamp = tmp / "stamp"
        inner = own_time_cmd(stamp, workload)

        def under(opts: list[str]) -> list[str]:
            return [gleaner, "run", "--state-dir", str(tmp / "state"), *opts, "--", *inner]

        cmds = ([inner, under(["--observe"])] + [under(c) for c in extra]
                + [beside_waker(waker, p, s, pol, inner) for _, p, s, pol in wakers])
        results = interleaved_rounds(args.rounds, cmds, timed_with_own_time(stamp))
    own = {n: [o for _, o in r] for n, r in zip(names, results)}
    rows = []
    for n in names[1:]:
        ratios = [x / b for x, b in zip(own[n], own["bare"])]
        rows.append({"setting": n, "own_s": own[n], "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios)})
        print(f"{n:<36} own time ×{rows[-1]['median_ratio']:.3f} (×{min(ratios):.3f}–×{max(ratios):.3f}) over {args.rounds} rounds", flush=True)
    result = {"machine_start": facts, "machine_end": machine_facts(), "workload": args.workload, "rounds": args.rounds, "bare_own_s": own["bare"], "rows": rows}
    out = args.out or Path("results") / f"perturbation-{time.strftime('%Y-%m-%d')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    m = facts
    md = [f"# What waking periodically costs a workload ({m['date_utc']})", "",
          f"commit `{m['commit']}`, cpuidle driver `{m['cpuidle_driver']}`, kernel {m['kernel']}, {m['cpus']} CPUs, loadavg at start {m['loadavg']}, at end {result['machine_end']['loadavg']}", "",
          f"Command: `sudo python3 bench/perturbation.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}`", "",
          f"Workload: `{args.workload}`; bare own run time median {statistics.median(own['bare']):.3f} s "
          f"(min {min(own['bare']):.3f}, max {max(own['bare']):.3f}). Each of {args.rounds} rounds runs every setting once, the order "
          "reversing every other round; the ratio is the workload's own run time against the same round's bare run.", "",
          "| setting | own time / bare: median | min | max |", "|---|---|---|---|"]
    md += [f"| {r['setting']} | ×{r['median_ratio']:.3f} | ×{r['min_ratio']:.3f} | ×{r['max_ratio']:.3f} |" for r in rows]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(f"written {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
