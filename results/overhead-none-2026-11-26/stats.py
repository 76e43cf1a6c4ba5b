#!/usr/bin/env python3
"""Median of per-round ratios with a 95 % bootstrap interval (seeded), and the geometric
mean with 1.96 standard errors, for each configuration of an ab.py JSON file against a
reference configuration (default the first).   python3 stats.py FILE.json [REF]"""
import json, math, random, statistics as st, sys
d = json.load(open(sys.argv[1])); r = d['res']
ref = sys.argv[2] if len(sys.argv) > 2 else next(iter(r))
rng = random.Random(1)
def boot(x, n=4000):
    m = sorted(st.median(rng.choices(x, k=len(x))) for _ in range(n))
    return m[int(0.025 * n)], m[int(0.975 * n)]
print(f"workload: {d['workload']}; load at end: {d['load'].strip()}")
for k, v in r.items():
    if k == ref:
        continue
    rat = [a / b for a, b in zip(v, r[ref])]
    lo, hi = boot(rat)
    lg = [math.log(x) for x in rat]
    gm, se = math.exp(st.mean(lg)), st.stdev(lg) / math.sqrt(len(lg))
    print(f"{k:8} / {ref:6} n={len(rat):3}  median x{st.median(rat):.3f} [{lo:.3f}, {hi:.3f}]  "
          f"geomean x{gm:.3f} ± {100*1.96*se:.1f} %  range {min(rat):.3f}-{max(rat):.3f}")
