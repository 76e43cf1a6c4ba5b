#!/usr/bin/env python3
"""One line per population of a lab output directory laid out as `gleaner sim lab` writes it
(grid.json or lab-grid.json, fresh.json or lab-fresh.json, draws/draw*.json): median / p90
regret, benchmark-VM losses (> 3 % below `none`) / system losses (below `none`), and the mean
against `none` over every scenario:

    python3 summary.py DIR
"""
import glob, json, os, statistics, sys

def load(paths):
    rows = []
    for p in paths:
        rows += json.load(open(p))['scenarios']
    return rows

def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float('nan')

def line(label, rows):
    reg = [s['regret'] for s in rows]
    bench = sum(s['bench_vs_none'] < -0.03 for s in rows)
    system = sum(s['system_vs_none'] < 0 for s in rows)
    return (f"{label:10s} {len(rows):4d} scenarios: regret median {statistics.median(reg)*100:.1f} % "
            f"p90 {quantile(reg, 0.9)*100:.1f} %; losses {bench} / {system}")

d = sys.argv[1]
grid = [p for p in (os.path.join(d, 'grid.json'), os.path.join(d, 'lab-grid.json')) if os.path.exists(p)]
fresh = [p for p in (os.path.join(d, 'fresh.json'), os.path.join(d, 'lab-fresh.json')) if os.path.exists(p)]
draws = sorted(glob.glob(os.path.join(d, 'draws', 'draw*.json')))
everything = []
if grid:
    rows = load(grid)
    everything += rows
    for s in ('tuning', 'held-out'):
        print(line(s, [r for r in rows if r['scenario']['set'] == s]))
if fresh:
    rows = load(fresh); everything += rows; print(line('fresh', rows))
if draws:
    rows = load(draws); everything += rows; print(line('draws', rows))
print(f"mean over {len(everything)} against none: benchmark VM "
      f"{statistics.mean(s['bench_vs_none'] for s in everything)*100:+.2f} %, system "
      f"{statistics.mean(s['system_vs_none'] for s in everything)*100:+.2f} %")
