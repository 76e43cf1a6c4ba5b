#!/usr/bin/env python3
"""When each Gleaner run of a daemon-suite JSON first packed (its first `deactivate`), and
which runs called a major change: `python3 packs.py results/daemon-....json [workload]`."""
import json
import sys


def runs_with_timelines(doc, workload):
    for w in doc["workloads"]:
        if workload and w.get("name") != workload:
            continue
        for r in w["runs"]:
            if r.get("timeline"):
                yield w.get("name"), r


def main():
    doc = json.load(open(sys.argv[1]))
    workload = sys.argv[2] if len(sys.argv) > 2 else None
    packs, majors, n = [], 0, 0
    for name, r in runs_with_timelines(doc, workload):
        n += 1
        events = [(row["t_s"], str(e)) for row in r["timeline"] for e in (row.get("events") or [])]
        first = next((t for t, e in events if "deactivate" in e), None)
        major = [round(t, 2) for t, e in events if "major" in e]
        majors += bool(major)
        packs.append(first)
        print(f"{name} rep {r.get('rep')}: {r.get('value'):.0f}, first packed at "
              f"{'never' if first is None else f'{first:.3f} s'}"
              + (f", major change at {major}" if major else ""))
    done = sorted(p for p in packs if p is not None)
    print(f"{n} runs; packed in {len(done)} (at {done[0]:.3f}-{done[-1]:.3f} s)" if done else f"{n} runs; never packed",
          f"; a major change in {majors}")


if __name__ == "__main__":
    main()
