#!/usr/bin/env python3
"""Medians of bench/overhead.py's self-cpu rows, per build (the file's name: new-N / old-N)."""
import glob, json, statistics, sys
from pathlib import Path
here = Path(__file__).parent
for mode in ("observe", "act"):
    rows = {}
    for f in sorted(glob.glob(str(here / mode / "*.json"))):
        build = Path(f).stem.split("-")[0]
        for r in json.load(open(f))["self_cpu"]:
            rows.setdefault((r["load"], r["sampler"]), {}).setdefault(build, []).append(r)
    print(f"## {mode}\n")
    print("| load | sampler | build | runs | CPU per period, ms: median (min–max) | period, ms | % of one CPU |")
    print("|---|---|---|---|---|---|---|")
    for (load, sampler), by in rows.items():
        for build in ("old", "new"):
            x = by.get(build, [])
            per = [r["self_cpu_ms_per_period"] for r in x if r.get("self_cpu_ms_per_period") is not None]
            plen = [r["period_ms"] for r in x if r.get("period_ms") is not None]
            frac = [r["self_cpu_fraction"] * 100 for r in x if r.get("self_cpu_fraction") is not None]
            if not per:
                continue
            print(f"| {load} | {sampler} | {build} | {len(per)} | {statistics.median(per):.3f} ({min(per):.3f}–{max(per):.3f}) "
                  f"| {statistics.median(plen):.0f} | {statistics.median(frac):.2f} |")
    print()
