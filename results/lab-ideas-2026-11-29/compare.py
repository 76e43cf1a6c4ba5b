#!/usr/bin/env python3
"""Scenarios whose benchmark-VM or system speedup against `none` moved by more than half a
point between two runs of the policy lab (same scenarios, e.g. the shipped policy and a
change), the system's change smallest first, then the mean change of the benchmark VM:

    python3 compare.py 'results/host-turns-2026-11-29-5008e6a/draws/draw*.json' 'DIR/draws/draw*.json'
    python3 compare.py results/host-turns-2026-11-29-5008e6a/lab-grid.json DIR/grid.json
"""
import glob, json, statistics, sys


def load(pattern):
    out = {}
    for f in sorted(glob.glob(pattern)):
        name = f.split('/')[-1].replace('lab-', '')
        for s in json.load(open(f))['scenarios']:
            out[(name, s['scenario']['name'])] = s
    return out


before, after = load(sys.argv[1]), load(sys.argv[2])
moved = []
for k, x in before.items():
    y = after.get(k)
    if y is None:
        continue
    if (abs(x['bench_vs_none'] - y['bench_vs_none']) > 0.005
            or abs(x['system_vs_none'] - y['system_vs_none']) > 0.005):
        moved.append((y['system_vs_none'] - x['system_vs_none'], k, x, y))
moved.sort(key=lambda m: m[0])
print(f'{len(moved)} of {len(before)} scenarios moved')
for _, k, x, y in moved:
    print(f"{k[0]:11s} {k[1]:42s} bench {x['bench_vs_none']*100:6.1f} -> {y['bench_vs_none']*100:6.1f}"
          f"  sys {x['system_vs_none']*100:6.1f} -> {y['system_vs_none']*100:6.1f}"
          f"  regret {x['regret']*100:5.1f} -> {y['regret']*100:5.1f}")
if moved:
    print(f"mean change of the benchmark VM over those: "
          f"{statistics.mean(y['bench_vs_none'] - x['bench_vs_none'] for _, _, x, y in moved)*100:+.2f} points")
