#!/usr/bin/env python3
# Paired ratios of throughput (config / bare, same round) from tp.py's JSON: median with a
# 95 % bootstrap interval of the median (10,000 resamples, fixed seed), geometric mean.
import json, sys, random, statistics, math
d = json.load(open(sys.argv[1])); res = d['res']; names = list(res); base = names[0]
rng = random.Random(1)
print(f"{d['workload']}  ({len(res[base])} rounds; load at the end {d['load'].split()[0]})")
for n in names[1:]:
    r = [a / b for a, b in zip(res[n], res[base])]
    meds = sorted(statistics.median(rng.choices(r, k=len(r))) for _ in range(10000))
    g = math.exp(statistics.mean(math.log(x) for x in r))
    print(f"  {n:8} throughput x{statistics.median(r):.3f} [{meds[250]:.3f}, {meds[9749]:.3f}]  geometric mean x{g:.3f}  range {min(r):.3f}-{max(r):.3f}")
