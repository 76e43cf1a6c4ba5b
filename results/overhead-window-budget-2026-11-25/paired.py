#!/usr/bin/env python3
"""Median of per-round ratios NUM/DEN with a seeded bootstrap 95 % interval of that median:
    python3 paired.py BATCH.json NUM/DEN ...
"""
import json, random, statistics as st, sys

d = json.load(open(sys.argv[1]))['res']
rng = random.Random(1)
for num, den in (a.split('/') for a in sys.argv[2:]):
    r = [a / b for a, b in zip(d[num], d[den])]
    meds = sorted(st.median(rng.choices(r, k=len(r))) for _ in range(2000))
    print(f"{num}/{den}: n={len(r)} median x{st.median(r):.3f} [{meds[50]:.3f}, {meds[1949]:.3f}]"
          f"  (median run {st.median(d[num]):.4f} s / {st.median(d[den]):.4f} s)")
