#!/usr/bin/env python3
"""Gleaner against bare, and the control against bare, pooled over several daemon-suite batches.

One batch of 12 rounds decides a paired ratio to about ±3 % on these workloads, no better than
the 3 % margin it is judged by; the batches of one kind of guest are pooled here so that a
presence cost of 1-3 % can be told from noise. Each pair is a round of one batch (Gleaner's run
against the bare run of the same round), so pooling keeps the pairing.

    python3 results/daemon-pooled-2026-11-28/pool.py DRIVER RESULTS.json...
"""
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from harness.stats import median_interval  # noqa: E402


def pairs(workload: dict, config: str) -> list[float]:
    by_rep: dict[int, dict[str, float]] = {}
    for run in workload.get("runs", []):
        if run["ok"]:
            by_rep.setdefault(run["rep"], {})[run["config"]] = run["value"]
    return [
        (r[config] / r["baseline"]) if workload["higher_is_better"] else (r["baseline"] / r[config])
        for r in by_rep.values()
        if config in r and "baseline" in r
    ]


def describe(values: list[float]) -> str:
    if not values:
        return "–"
    low, high = median_interval(values)
    return f"×{statistics.median(values):.3f} [{low:.3f}, {high:.3f}] ({len(values)})"


def main(driver: str, files: list[str]) -> None:
    pooled: dict[str, tuple[list[float], list[float]]] = {}
    print("| batch | commit | load | workload | gleaner vs bare | control vs bare |")
    print("|---|---|---|---|---|---|")
    for name in files:
        results = json.loads(Path(name).read_text())
        if results["host"]["cpuidle_driver"] != driver:
            continue
        commit = results["host"].get("commit", "?")[:7]
        load = results["load"]["before"][0]
        for workload in results["workloads"]:
            gleaner, control = pairs(workload, "gleaner"), pairs(workload, "control")
            if not gleaner:
                continue
            print(f"| {Path(name).name} | {commit} | {load:.2f} | {workload['name']} | "
                  f"{describe(gleaner)} | {describe(control)} |")
            g, c = pooled.setdefault(workload["name"], ([], []))
            g += gleaner
            c += control
    print()
    print("| workload | gleaner vs bare, pooled: median [95 % interval] (pairs) | control vs bare, pooled |")
    print("|---|---|---|")
    for name, (g, c) in pooled.items():
        print(f"| {name} | {describe(g)} | {describe(c)} |")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: pool.py CPUIDLE_DRIVER RESULTS.json... (e.g. pool.py haltpoll results/daemon-2026-11-2*.json)")
    main(sys.argv[1], sys.argv[2:])
