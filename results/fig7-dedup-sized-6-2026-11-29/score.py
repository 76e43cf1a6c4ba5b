#!/usr/bin/env python3
"""Scores the dedup VM sized 6 vCPUs (guest gleaner, hold, none) in fig7 seed 5 as
scenarios/fig7-lab-score.py scores fig7: each VM's compute per second over its solo run as the
scenario configures it (16 vCPUs, guest none); system = the sum.

    python3 results/fig7-dedup-sized-6-2026-11-29/score.py target/release/examples/sim
"""
import importlib.util
import pathlib
import sys

here = pathlib.Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location('f7', here.parents[1] / 'scenarios' / 'fig7-lab-score.py')
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
sim = sys.argv[1]
base = open(m.SCENARIO).read().replace('weighted_speedup = true', 'weighted_speedup = false').replace('\nseed = 1\n', '\nseed = 5\n', 1)
matmul_at = base.index('[[vm]]\nname = "matmul"')
solo = [m.run(sim, base[:matmul_at])[0], m.run(sim, base[:base.index('[[vm]]')] + base[matmul_at:])[0]]
for guest in ('none', 'hold', 'gleaner'):
    d, mm = m.run(sim, (here / f'dedup-6-{guest}-seed5.toml').read_text())
    print(f'dedup VM of 6 vCPUs, {guest:8s} dedup {d / solo[0]:.3f} matmul {mm / solo[1]:.3f} system {d / solo[0] + mm / solo[1]:.3f}')
