"""`sysbench threads` bare and under Gleaner (full, observing, observing with the procfs
sampler), each round in its own order (a row of the daemon harness's balanced Latin square):

    GLEANER=target/release/gleaner python3 results/sysbench-presence-2026-12-04/run.py 40 bare,full,observe,observe-procfs OUT.json
    GLEANER=target/release/gleaner python3 results/sysbench-presence-2026-12-04/run.py 40 bare,full,full-timeline OUT.json
"""
import json, subprocess, sys, re, os, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from harness.configs import balanced_orders
G = os.environ.get("GLEANER", "target/release/gleaner")
# A file, as in the measured rounds (they wrote /tmp/pp/tl.jsonl and /tmp/sb/tl.jsonl, appending).
TIMELINE = os.path.join(tempfile.gettempdir(), "gleaner-presence-timeline.jsonl")
SB = ["sysbench", "threads", "--threads=8", "--thread-locks=2", "--time=3", "run"]
C = {
    "bare": SB,
    "full": [G, "run", "--"] + SB,
    "observe": [G, "run", "--observe", "--"] + SB,
    "full-timeline": [G, "run", "--timeline", TIMELINE, "--"] + SB,
    "observe-procfs": [G, "run", "--observe", "--sampler", "procfs", "--"] + SB,
}
names = sys.argv[2].split(",")
rounds = int(sys.argv[1])
res = {n: [] for n in names}
for r, order in enumerate(balanced_orders(len(names), rounds)):
    for i in order:
        n = names[i]
        out = subprocess.run(C[n], capture_output=True, text=True).stdout
        m = re.search(r"total number of events:\s+(\d+)", out)
        res[n].append(int(m.group(1)) if m else None)
    print(r, {n: res[n][-1] for n in names}, flush=True)
    json.dump(res, open(sys.argv[3], "w"))
