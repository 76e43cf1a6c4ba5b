#!/usr/bin/env python3
# Interleaved throughput of one workload under several wrappers, paired by round; the order of
# configurations reverses every round.
#   OUT=FILE.json python3 tp.py ROUNDS "WORKLOAD COMMAND" NAME=ARGS...
# ARGS: `bare` (the workload alone), `CMD:PREFIX` (PREFIX then the workload), or the arguments
# of `gleaner run` (empty: plain `gleaner run --`). The workload prints `throughput=N`.
# With TP_KEEP_EPS=1 (what ../presence-sysbench-2026-11-28-0500-148eefd/tp2.py sets) each run is
# kept as {"total": N, "eps": [...]}, the `eps=X` lines it printed being its per-second series.
import json, os, re, statistics, subprocess, sys
G = os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../target/release/gleaner')
rounds = int(sys.argv[1]); W = sys.argv[2].split()
V = [a.split('=', 1) for a in sys.argv[3:]]
keep_eps = os.environ.get('TP_KEEP_EPS') == '1'
res = {n: [] for n, _ in V}
for r in range(rounds):
    for n, args in (V if r % 2 == 0 else V[::-1]):
        if args == 'bare':
            cmd = W
        elif args.startswith('CMD:'):
            cmd = args[4:].split() + W
        else:
            cmd = [G, 'run', *args.split(), '--', *W]
        out = subprocess.run(cmd, capture_output=True, text=True).stdout
        total = float(re.search(r'throughput=([\d.]+)', out).group(1))
        res[n].append({'total': total, 'eps': [float(x) for x in re.findall(r'eps=([\d.]+)', out)]}
                      if keep_eps else total)
json.dump({'workload': sys.argv[2], 'load': open('/proc/loadavg').read(), 'res': res},
          open(os.environ.get('OUT', '/tmp/tp.json'), 'w'))
b = V[0][0]
tot = {n: [x['total'] if keep_eps else x for x in res[n]] for n, _ in V}
for n, _ in V:
    rat = [a / c for a, c in zip(tot[n], tot[b])]
    print(f"{n:10} median {statistics.median(tot[n]):10.1f} ratio {statistics.median(rat):.3f} [{min(rat):.3f},{max(rat):.3f}]")
