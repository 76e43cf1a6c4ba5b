#!/usr/bin/env python3
"""Scores scenarios/fig7-dedup-matmul.toml as the policy lab scores a scenario (issue 16's
fig7 target): each VM's compute completed per second over its solo run as configured (16
vCPUs, guest none); system = the sum. Configurations: none, gleaner, and every static vCPU
count of the dedup VM (1-15), without and with retention, as the lab's static oracle has
them. The best static setting is the lab's: the highest system among those that keep the
dedup VM within 3 % of none (the unconstrained best is printed too).

One seed is one draw of a chaotic system (Gleaner's path through the vCPU counts changes
with it), so the scenario is scored on several seeds (default 1-5) and the verdict is taken
per seed and on the medians.

    cargo build --release -p gleaner-sim --example sim
    python3 scenarios/fig7-lab-score.py target/release/examples/sim [--seeds 1,2,3,4,5]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor

SCENARIO = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fig7-dedup-matmul.toml')
STATIC_COUNTS = range(1, 16)


def configurations(base):
    """(label, scenario text) for every configuration scored."""
    yield 'none', base
    yield 'gleaner', base.replace('guest = "none"', 'guest = "gleaner"', 1)
    for retain in (False, True):
        for k in STATIC_COUNTS:
            guest = 'hold' if retain else 'none'
            text = base.replace('vcpus = 16\nguest = "none"',
                                f'vcpus = 16\nactive_vcpus = {k}\nguest = "{guest}"', 1)
            yield f'static-{k}{"+retain" if retain else ""}', text


def run(sim, text):
    with tempfile.NamedTemporaryFile('w', suffix='.toml', delete=False) as f:
        f.write(text)
        path = f.name
    try:
        out = subprocess.run([sim, path, '--json'], capture_output=True, text=True, check=True)
    finally:
        os.unlink(path)
    r = json.loads(out.stdout)
    return [v['completed_work_ns'] / r['simulated_ns'] for v in r['vms']]


def score_seed(sim, seed, pool):
    base = open(SCENARIO).read().replace('weighted_speedup = true', 'weighted_speedup = false')
    base = base.replace('\nseed = 1\n', f'\nseed = {seed}\n', 1)
    matmul_at = base.index('[[vm]]\nname = "matmul"')
    dedup_only = base[:matmul_at]
    matmul_only = base[:base.index('[[vm]]')] + base[matmul_at:]
    solo_jobs = [pool.submit(run, sim, dedup_only), pool.submit(run, sim, matmul_only)]
    jobs = [(label, pool.submit(run, sim, text)) for label, text in configurations(base)]
    solo = [solo_jobs[0].result()[0], solo_jobs[1].result()[0]]
    rows = {}
    for label, job in jobs:
        sp = [r / s for r, s in zip(job.result(), solo)]
        rows[label] = (sp[0], sum(sp))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('sim', help='the simulator binary (target/release/examples/sim)')
    ap.add_argument('--seeds', default='1,2,3,4,5', help='comma-separated seeds (default 1-5)')
    ap.add_argument('--all-rows', action='store_true', help='print every configuration')
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(',')]
    commit = subprocess.run(['git', 'describe', '--always', '--dirty'], capture_output=True,
                            text=True).stdout.strip()
    print(f'# fig7 scored as the lab scores it; commit {commit}; host {platform.node()}; '
          f'load {open("/proc/loadavg").read().split()[0]} (the simulator is deterministic)')
    summary = []
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for seed in seeds:
            rows = score_seed(args.sim, seed, pool)
            none_bench = rows['none'][0]
            statics = {k: v for k, v in rows.items() if k.startswith('static-') or k == 'none'}
            ok = {k: v for k, v in statics.items() if v[0] >= 0.97 * none_bench}
            best = max(ok, key=lambda k: ok[k][1])
            best_any = max(statics, key=lambda k: statics[k][1])
            g = rows['gleaner']
            print(f'seed {seed}')
            shown = rows if args.all_rows else {k: rows[k] for k in dict.fromkeys(
                ['none', 'gleaner', best, best_any])}
            for label, (bench, system) in shown.items():
                tag = ' (best static)' if label == best else ''
                tag += ' (best, unconstrained)' if label == best_any and label != best else ''
                print(f'  {label:18} dedup {bench:.3f}  system {system:.3f}{tag}')
            ratio = g[1] / rows[best][1]
            print(f'  gleaner / best static: system {ratio:.3f}; dedup vs none '
                  f'{g[0] / none_bench - 1:+.1%}')
            summary.append((seed, g[1], rows[best][1], ratio, g[0] / none_bench - 1, best))
    print('\nseed  gleaner  best static  ratio  dedup vs none  best')
    for seed, g, b, ratio, dvn, best in summary:
        print(f'{seed:4}  {g:7.3f}  {b:11.3f}  {ratio:5.3f}  {dvn:+12.1%}  {best}')
    med = statistics.median
    print(f'median  {med(s[1] for s in summary):.3f}  {med(s[2] for s in summary):11.3f}  '
          f'{med(s[3] for s in summary):5.3f}  {med(s[4] for s in summary):+12.1%}')
    met = sum(1 for s in summary if s[3] >= 1.0)
    print(f'target (gleaner >= best static) met on {met} of {len(summary)} seeds')


if __name__ == '__main__':
    main()
