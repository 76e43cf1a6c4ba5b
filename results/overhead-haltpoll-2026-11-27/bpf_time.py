#!/usr/bin/env python3
"""BPF programs' own run time under `gleaner run --observe` of a ping-pong, per binary,
interleaved: kernel.bpf_stats_enabled=1 for the batch (restored after, also on failure);
run_time_ns and run_cnt summed over the programs the gleaner process holds, read every
0.25 s until it exits (bench/overhead.py's watch_gleaner).
   python3 bpf_time.py ROUNDS OUT.json NAME=BINARY..."""
import json, os, re, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from overhead import watch_gleaner, BPF_STATS  # noqa: E402

rounds, out = int(sys.argv[1]), sys.argv[2]
bins = [a.split("=", 1) for a in sys.argv[3:]]
res = {n: [] for n, _ in bins}
before = BPF_STATS.read_text().strip()
try:
    BPF_STATS.write_text("1")
    for r in range(rounds):
        for name, b in (bins if r % 2 == 0 else bins[::-1]):
            cmd = [b, "run", "--observe", "--", b, "workload", "pingpong", "--duration", "4"]
            w = watch_gleaner(cmd)
            tput = float(re.search(r"throughput=([\d.]+)", w["workload_stdout"]).group(1))
            res[name].append({"bpf_run_time_ns": w["bpf_run_time_ns"], "bpf_run_cnt": w["bpf_run_cnt"],
                              "round_trips_per_s": tput, "self_cpu_fraction": w["self_cpu_fraction"]})
            print(name, res[name][-1], flush=True)
finally:
    BPF_STATS.write_text(before)
json.dump({"load": open("/proc/loadavg").read(), "res": res}, open(out, "w"), indent=1)
