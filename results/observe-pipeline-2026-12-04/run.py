"""Fine pipeline bare and under `gleaner run --observe` variants, balanced order per round.
    GLEANER=target/release/gleaner python3 results/observe-pipeline-2026-12-04/run.py 16 bare,observe,observe-procfs,observe-affinity OUT.json"""
import json, subprocess, sys, os, time
sys.path.insert(0, '/work/main/bench')
from harness.configs import balanced_orders
G = os.environ.get("GLEANER", "target/release/gleaner")
W = [G, "workload", "pipeline", "--work", "500", "--items", "300000"]
C = {
    "bare": W,
    "observe": [G, "run", "--observe", "--"] + W,
    "observe-procfs": [G, "run", "--observe", "--sampler", "procfs", "--"] + W,
    "observe-affinity": [G, "run", "--observe", "--backend", "affinity", "--"] + W,
    "full": [G, "run", "--"] + W,
}
names = sys.argv[2].split(","); rounds = int(sys.argv[1])
res = {n: [] for n in names}
for r, order in enumerate(balanced_orders(len(names), rounds)):
    for i in order:
        n = names[i]
        t = time.monotonic()
        subprocess.run(C[n], capture_output=True, text=True, check=True)
        res[n].append(time.monotonic() - t)
    json.dump(res, open(sys.argv[3], "w"))
import statistics as st
for n in names[1:]:
    rs = [a / b for a, b in zip(res[n], res[names[0]])]
    print(n, "time ratio median %.3f" % st.median(rs), "min %.3f max %.3f" % (min(rs), max(rs)))
