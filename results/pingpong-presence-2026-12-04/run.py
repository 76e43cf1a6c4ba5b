"""Ping-pong pinned to one vCPU, under `gleaner run`, and pinned under `gleaner run --observe`,
in rounds whose order rotates and reverses every other round:

    GLEANER=target/release/gleaner python3 run.py ROUNDS one,gleaner,one-observe OUT.json
"""
import json, os, subprocess, sys
G = os.environ.get("GLEANER", "target/release/gleaner")
W = [G, "workload", "pingpong", "--duration", "3s", "--json"]
CONFIGS = {
    "one": ["taskset", "-c", "0"] + W,
    "gleaner": [G, "run", "--timeline", os.devnull, "--"] + W,
    "one-observe": ["taskset", "-c", "0", G, "run", "--observe", "--"] + W,
}
names = sys.argv[2].split(",")
rounds = int(sys.argv[1])
res = {n: [] for n in names}
for r in range(rounds):
    order = names[r % len(names):] + names[:r % len(names)]
    if r % 2: order = order[::-1]
    for n in order:
        out = subprocess.run(CONFIGS[n], capture_output=True, text=True)
        line = [l for l in out.stdout.splitlines() if l.startswith("{")]
        v = json.loads(line[-1]) if line else None
        rate = v["throughput_per_s"] if v else out.stderr[-300:]
        res[n].append(rate)
        print(r, n, rate if not isinstance(rate, dict) else json.dumps(rate)[:200], flush=True)
json.dump(res, open(sys.argv[3], "w"))
