"""Ping-pong pinned to one vCPU, under `gleaner run`, and pinned under `gleaner run --observe`,
in rounds whose order rotates and reverses every other round:

    GLEANER=target/release/gleaner python3 run.py ROUNDS one,gleaner,one-observe OUT.json
"""
import json, os, subprocess, sys, tempfile
G = os.environ.get("GLEANER", "target/release/gleaner")
# A file, as in the measured rounds (they wrote /tmp/pp/tl.jsonl and /tmp/sb/tl.jsonl, appending).
TIMELINE = os.path.join(tempfile.gettempdir(), "gleaner-presence-timeline.jsonl")
W = [G, "workload", "pingpong", "--duration", "3s", "--json"]
CONFIGS = {
    "one": ["taskset", "-c", "0"] + W,
    "gleaner": [G, "run", "--timeline", TIMELINE, "--"] + W,
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
        print(r, n, rate, flush=True)
json.dump(res, open(sys.argv[3], "w"))
