"""Per-guest speedups, the weighted speedup, a Markdown table and a plot from runs.jsonl.

Why it exists: a results directory must be summarisable again without rerunning it
(`testbed.py summarize`), and the statistics and plots are the bench harness's own
(harness.stats, harness.plots), so the test bed and the benchmark suites report alike.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from harness import stats

from .errors import TestbedError
from .experiment import SETTINGS, Experiment, load_experiment

def _spread(values: list[float]) -> dict | None:
    """The harness's median and range as a JSON object (keys median, min, max, n)."""
    summary = stats.summarise(values)
    return dataclasses.asdict(summary) if summary else None


def _speedup_spread(values: list[float]) -> dict | None:
    """`_spread` plus a 95 % bootstrap interval of the median (keys low, high): with a dozen
    pairs whose single ratios stray ±15 %, the range alone cannot say how sure the median is."""
    spread = _spread(values)
    if spread:
        spread["low"], spread["high"] = stats.median_interval(values)
    return spread


def summarize(records: list[dict], cases_paper: dict[str, dict] | None = None) -> dict:
    """Per case: per-guest throughput by setting, speedups of on over off and the weighted speedup.

    Speedups are formed per repetition from the adjacent off/on pair (they ran back to back
    in the same booted guests), then summarised by median and range over repetitions.
    """
    summary = {}
    records = [r for r in records if r["setting"] in SETTINGS]
    for case in dict.fromkeys(r["case"] for r in records):
        by_rep: dict[int, dict[str, dict]] = {}
        for r in records:
            if r["case"] == case:
                by_rep.setdefault(r["rep"], {})[r["setting"]] = r
        first = next(r for r in records if r["case"] == case)
        roles = {name: g["role"] for name, g in sorted(first["guests"].items())}
        throughput = {name: {s: [] for s in SETTINGS} for name in roles}
        speedups = {name: [] for name in roles}
        weighted = []
        # Host view of each guest's vCPU threads, per setting: CPU seconds per wall second
        # and context switches per wall second (what retention and consolidation change).
        vcpu_cpu = {name: {s: [] for s in SETTINGS} for name in roles}
        vcpu_switches = {name: {s: [] for s in SETTINGS} for name in roles}
        overlap = {s: [] for s in SETTINGS}
        for rep in sorted(by_rep):
            pair = by_rep[rep]
            if set(pair) != set(SETTINGS):
                continue  # an interrupted repetition has only one setting
            ok = all(
                pair[s]["guests"][n]["rc"] == 0 and pair[s]["guests"][n]["report"].get("throughput_per_s", 0) > 0
                for s in SETTINGS
                for n in roles
            )
            if not ok:
                continue
            rep_speedups = []
            for setting in SETTINGS:
                run = pair[setting]
                if run.get("overlap") is not None:
                    overlap[setting].append(run["overlap"])
                wall = run.get("wall_s", 0)
                for name in roles:
                    threads = run["guests"][name].get("vcpu_threads", {})
                    if wall > 0 and threads:
                        vcpu_cpu[name][setting].append(sum(t["cpu_s"] for t in threads.values()) / wall)
                        switches = sum(t["voluntary_switches"] + t["involuntary_switches"] for t in threads.values())
                        vcpu_switches[name][setting].append(switches / wall)
            for name in roles:
                off = pair["off"]["guests"][name]["report"]["throughput_per_s"]
                on = pair["on"]["guests"][name]["report"]["throughput_per_s"]
                throughput[name]["off"].append(off)
                throughput[name]["on"].append(on)
                speedups[name].append(on / off)
                rep_speedups.append(on / off)
            weighted.append(sum(rep_speedups) / len(rep_speedups))
        summary[case] = {
            "roles": roles,
            "throughput_per_s": {n: {s: _spread(v) for s, v in t.items() if v} for n, t in throughput.items()},
            "speedup": {n: _speedup_spread(v) for n, v in speedups.items() if v},
            "weighted_speedup": _speedup_spread(weighted) if weighted else None,
            "vcpu_cpu_per_s": {n: {s: _spread(v) for s, v in t.items() if v} for n, t in vcpu_cpu.items()},
            "vcpu_switches_per_s": {n: {s: _spread(v) for s, v in t.items() if v} for n, t in vcpu_switches.items()},
            "window_overlap": {s: _spread(v) for s, v in overlap.items() if v},
            "paper": (cases_paper or {}).get(case, {}),
            # JSON keys are strings: guest -> {"vCPU index": host CPU}; None where unpinned.
            "vcpu_pinning": first.get("vcpu_pinning"),
        }
    return summary


def _fmt(spread: dict | None, digits: int = 2) -> str:
    if not spread:
        return "n/a"
    return f"{spread['median']:.{digits}f} [{spread['min']:.{digits}f}, {spread['max']:.{digits}f}]"


def _fmt_interval(spread: dict | None) -> str:
    # Results written before the interval existed have no low/high: summarize redoes them.
    if not spread or "low" not in spread:
        return "-"
    return f"[{spread['low']:.2f}, {spread['high']:.2f}]"


def summary_markdown(summary: dict, manifest: dict, exp_name: str) -> str:
    lines = [
        f"# Test bed: {exp_name}",
        "",
        f"Image {manifest.get('image_sha256', '?')} ({manifest.get('kernel_package', '?')}, "
        f"gleaner {manifest.get('git_commit', '?')[:12]}).",
        "Speedup = throughput with Gleaner on / off, paired per interleaved repetition; "
        "weighted speedup = mean of the guests' speedups (paper §7.2.1). Median [min, max] of the",
        "pairs, then the 95 % bootstrap interval of that median.",
        "",
        "| case | pairs | benchmark speedup | interval | co-runner speedup | weighted speedup | interval | paper |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, s in summary.items():
        bench = [n for n, r in s["roles"].items() if r == "benchmark"]
        corun = [n for n, r in s["roles"].items() if r == "corunner"]
        paper = "; ".join(f"{k}: {v}" for k, v in s["paper"].items()) or "-"
        bench_speedup = s["speedup"].get(bench[0])
        lines.append(
            f"| {case} | {bench_speedup['n'] if bench_speedup else 0} | {_fmt(bench_speedup)} | "
            f"{_fmt_interval(bench_speedup)} | "
            f"{', '.join(_fmt(s['speedup'].get(n)) for n in corun) or '-'} | "
            f"{_fmt(s['weighted_speedup'])} | {_fmt_interval(s['weighted_speedup'])} | {paper} |"
        )
    lines += [
        "",
        "Per guest, Gleaner off / on: workload throughput; host CPU seconds of its QEMU vCPU threads",
        "per wall second; their context switches per wall second.",
        "",
        "| case | guest | throughput off (ops/s) | on | vCPU CPU/s off | on | vCPU switches/s off | on |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, s in summary.items():
        for name, t in s["throughput_per_s"].items():
            cpu = s.get("vcpu_cpu_per_s", {}).get(name, {})
            sw = s.get("vcpu_switches_per_s", {}).get(name, {})
            lines.append(
                f"| {case} | {name} | {_fmt(t.get('off'))} | {_fmt(t.get('on'))} | "
                f"{_fmt(cpu.get('off'))} | {_fmt(cpu.get('on'))} | {_fmt(sw.get('off'), 0)} | {_fmt(sw.get('on'), 0)} |"
            )
    lines += ["", "Fraction of the benchmark's run window with the co-runner running too (1 = fully contended):", ""]
    for case, s in summary.items():
        ov = s.get("window_overlap", {})
        lines.append(f"* {case}: off {_fmt(ov.get('off'))}, on {_fmt(ov.get('on'))}")
    lines += ["", "Placement of the vCPU threads on the host:", ""]
    for case, s in summary.items():
        pinning = s.get("vcpu_pinning")
        if pinning:
            where = "; ".join(
                f"{guest} " + ", ".join(f"vCPU {v} on CPU {c}" for v, c in sorted(m.items(), key=lambda x: int(x[0])))
                for guest, m in sorted(pinning.items())
            )
            lines.append(f"* {case}: pinned ({where})")
        else:
            lines.append(f"* {case}: not pinned (the host scheduler placed and moved them)")
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> str | None:
    """Bars of median speedups with min-max whiskers; returns why not when it cannot plot."""
    try:
        from harness import plots
    except ImportError:
        return "matplotlib is not installed (testbed/setup.sh installs it)"
    cases = list(summary)
    series = []
    for label, role in (("benchmark", "benchmark"), ("co-runner", "corunner"), ("weighted", None)):
        bars = []
        for case in cases:
            s = summary[case]
            if role is None:
                spread = s["weighted_speedup"]
            else:
                names = [n for n, r in s["roles"].items() if r == role]
                spread = s["speedup"].get(names[0]) if names else None
            bars.append((spread["median"], spread["min"], spread["max"]) if spread else None)
        series.append((label, bars))
    plots.range_bars(cases, series, path, ylabel="speedup, Gleaner on / off", figsize=(1.8 + 1.6 * len(cases), 3.2))
    return None


def _read_runs(out_dir: Path) -> list[dict]:
    runs_path = out_dir / "runs.jsonl"
    try:
        records = [json.loads(line) for line in runs_path.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as err:
        raise TestbedError(f"cannot read {runs_path}: {err}; is this a test bed results directory?") from err
    if not records:
        raise TestbedError(f"{runs_path} holds no runs; nothing to summarise")
    return records


def pool_markdown(dirs: list[Path]) -> str:
    """The pairs of several results directories of one experiment summarised together.

    Why: eight pairs of 20 s runs here stray ±20 % from one another, so one batch cannot tell
    a few percent from zero; batches whose Gleaner did the same (e.g. nothing) can be pooled.
    Repetitions are renumbered so that pairs stay within their batch.
    """
    if len(set(dirs)) != len(dirs):
        raise TestbedError("a results directory is named twice; pool each batch once")
    pooled: list[dict] = []
    batches = []
    for d in dirs:
        records = _read_runs(d)
        offset = 1 + max((r["rep"] for r in pooled), default=-1)
        pooled += [{**r, "rep": r["rep"] + offset} if r["rep"] >= 0 else r for r in records]
        manifest_path = d / "image-manifest.json"
        manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
        batches.append(f"`{d.name}` (gleaner {manifest.get('git_commit', '?')[:12]})")
    table = summary_markdown(summarize(pooled), {}, "pooled").split("\n")
    first_table = table[table.index("| case | pairs | benchmark speedup | interval | co-runner speedup | weighted speedup | interval | paper |"):]
    first_table = first_table[: first_table.index("")]
    return "\n".join([
        f"Pooled over {len(dirs)} batch(es): {', '.join(batches)}.",
        "Speedup = throughput with Gleaner on / off, paired per repetition within its batch; "
        "median [min, max] of the pairs, then the 95 % bootstrap interval of that median.",
        "",
        *first_table,
    ]) + "\n"


def write_summary(out_dir: Path, exp: Experiment | None) -> Path:
    records = _read_runs(out_dir)
    if exp is None and (out_dir / "experiment.toml").is_file():
        exp = load_experiment(out_dir / "experiment.toml")
    papers = {c.name: c.paper for c in exp.cases} if exp else {}
    summary = summarize(records, papers)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    manifest_path = out_dir / "image-manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    md = summary_markdown(summary, manifest, exp.name if exp else out_dir.name)
    why_not = plot(summary, out_dir / "speedup.png")
    if why_not:
        md += f"\nNo plot: {why_not}.\n"
    else:
        md += "\n![speedups](speedup.png)\n"
    (out_dir / "summary.md").write_text(md)
    return out_dir / "summary.md"
