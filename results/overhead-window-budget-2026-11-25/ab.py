#!/usr/bin/env python3
# Interleaved own-time A/B (the protocol of ../overhead-presence-2026-11-25/ab.py, plus two
# keys): each configuration is NAME=ENV;ARGS, ARGS `bare` (the workload alone) or the
# arguments of `gleaner run`; ENV is KEY:VALUE,... set for gleaner, except
#   PRE:SECONDS  the wrapper sleeps this long before it stamps the start and runs the workload
#                (the workload turns busy after a quiet start; applied to bare runs too)
#   BIN:PATH     the gleaner binary to run (default: this checkout's target/release/gleaner)
# The workload's own run time is stamped by the shell inside every wrapper, so Gleaner's
# start-up and exit are not counted. The order of configurations reverses every round.
#   python3 ab.py "WORKLOAD COMMAND" ROUNDS OUT.json CONFIG...
import json, os, subprocess, sys, time, statistics, random
G = os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../target/release/gleaner')
W = sys.argv[1]  # workload command string
rounds = int(sys.argv[2]); out = sys.argv[3]
configs = []
for spec in sys.argv[4:]:
    name, rest = spec.split('=', 1)
    env, args = rest.split(';', 1)
    configs.append((name, env, args))
os.makedirs('/tmp/x', exist_ok=True)
stamp = '/tmp/x/stamp'
res = {c[0]: [] for c in configs}
for r in range(rounds):
    order = configs if r % 2 == 0 else configs[::-1]
    for name, env, args in order:
        e = dict(os.environ)
        for kv in filter(None, env.split(',')):
            k, v = kv.split(':'); e[k] = v
        pre = f"sleep {e.pop('PRE')}; " if 'PRE' in e else ''
        gbin = e.pop('BIN', G)
        inner = f'{pre}s=$(date +%s%N); {W} >/dev/null 2>&1; e=$(date +%s%N); echo "$s $e" > {stamp}'
        cmd = ['/bin/sh', '-c', inner] if args == 'bare' else [gbin, 'run', *args.split(), '--', '/bin/sh', '-c', inner]
        subprocess.run(cmd, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        s, t = (int(x) for x in open(stamp).read().split())
        res[name].append((t - s) / 1e9)
    json.dump({'workload': W, 'load': open('/proc/loadavg').read(), 'res': res}, open(out, 'w'))
base = configs[0][0]
for name, *_ in configs:
    ratios = [a / b for a, b in zip(res[name], res[base])]
    print(f'{name:12} median {statistics.median(res[name]):.4f}s  ratio median {statistics.median(ratios):.4f} mean {statistics.mean(ratios):.4f} [{min(ratios):.3f},{max(ratios):.3f}] n={len(ratios)}')
