"""Turning raw run records into summaries and the Markdown results table.

Everything here is a pure function of the results dictionary (the same one written
to `results/<suite>-<date>.json`), so the table can be regenerated from a JSON file
and is unit-tested without running anything.
"""

from __future__ import annotations

import statistics

from .configs import CONTROLS
from .stats import PairedRatio, Speedup, Summary, format_value, paired_ratio, speedup, summarise

#: Issue 16's targets for `gleaner run` on a real guest: never more than 3 % below running the
#: program as is, and within 5 % of the best fixed setting (doing nothing included).
BASELINE_MARGIN = 0.97
BEST_STATIC_MARGIN = 0.95


def config_summary(workload: dict, config: str) -> Summary | None:
    """Median/min/max of the successful runs of `config` for one workload record."""
    return summarise(list(values_by_rep(workload, config).values()))


def config_speedup(workload: dict, config: str) -> Speedup | None:
    base = config_summary(workload, "baseline")
    mine = config_summary(workload, config)
    if base is None or mine is None:
        return None
    return speedup(mine, base, workload["higher_is_better"])


def values_by_rep(workload: dict, config: str) -> dict[int, float]:
    """The successful runs of `config`, keyed by repetition."""
    return {run["rep"]: run["value"] for run in workload["runs"] if run["config"] == config and run["ok"]}


def config_paired(workload: dict, config: str, against: str = "baseline") -> PairedRatio | None:
    """`config` against `against`, paired by repetition (>1: `config` better)."""
    return paired_ratio(values_by_rep(workload, config), values_by_rep(workload, against),
                        workload["higher_is_better"])


def best_static(workload: dict, configs: list[str]) -> str | None:
    """The fixed setting (every configuration but `gleaner` and the control, `baseline` included)
    with the best median."""
    medians = {c: s.median for c in configs
               if c != "gleaner" and c not in CONTROLS and (s := config_summary(workload, c))}
    if not medians:
        return None
    pick = max if workload["higher_is_better"] else min
    return pick(medians, key=medians.get)


def target_check(ratio: PairedRatio | None, margin: float) -> str:
    """Whether Gleaner's paired ratio meets `margin`: met by the median, missed with the whole
    interval below it (a loss shown), or missed by a median whose interval still reaches it."""
    if ratio is None:
        return "no pairs"
    if ratio.median >= margin:
        return "met"
    if ratio.high < margin:
        return "**not met**"
    return "not met by the median; the interval reaches it"


def mean_idle_rate(workload: dict, config: str) -> float | None:
    """Median over runs of the per-vCPU mean idle transitions per second."""
    per_run = [
        statistics.fmean(run["idle_per_s"].values())
        for run in workload["runs"]
        if run["config"] == config and run["ok"] and run.get("idle_per_s")
    ]
    return statistics.median(per_run) if per_run else None


def summarise_workload(workload: dict, configs: list[str]) -> dict:
    """The `summary` block stored per workload in the JSON."""
    block = {}
    for config in configs:
        summary = config_summary(workload, config)
        ratio = config_speedup(workload, config)
        total = sum(1 for run in workload["runs"] if run["config"] == config)
        block[config] = {
            "runs": total,
            "ok": summary.n if summary else 0,
            "median": summary.median if summary else None,
            "min": summary.min if summary else None,
            "max": summary.max if summary else None,
            "speedup": ratio.median if ratio else None,
            "speedup_min": ratio.low if ratio else None,
            "speedup_max": ratio.high if ratio else None,
            "idle_per_s_per_vcpu": mean_idle_rate(workload, config),
        }
        if config != "baseline" and (paired := config_paired(workload, config)):
            block[config]["paired_speedup"] = {"pairs": paired.n, "median": paired.median,
                                               "low95": paired.low, "high95": paired.high}
    return block


def _cell(entry: dict) -> str:
    if entry["ok"] == 0:
        return f"failed ({entry['runs']} runs)" if entry["runs"] else "–"
    text = f"{format_value(entry['median'])} [{format_value(entry['min'])}–{format_value(entry['max'])}]"
    if entry["speedup"] is not None:
        text += f" ×{entry['speedup']:.2f}"
    if entry["ok"] < entry["runs"]:
        text += f" ({entry['runs'] - entry['ok']} failed)"
    return text


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _gleaner_against_static(results: dict, configs: list[str]) -> list[str]:
    others = [c for c in configs if c != "gleaner" and c not in CONTROLS]
    controls = [c for c in configs if c in CONTROLS]
    lines = ["Gleaner against each fixed setting, paired by repetition: median of the per-repetition "
             "ratios (>1: Gleaner better) [95 % bootstrap interval of that median]; the targets are "
             f"×{BASELINE_MARGIN:.2f} of baseline and ×{BEST_STATIC_MARGIN:.2f} of the best fixed setting "
             "(by median, baseline included). An interval that straddles a target is too wide to "
             "decide it: pool this batch with others of the same guest (`python3 bench/pool.py FILES`).", ""]
    if controls:
        lines[0] += (" The control column is the same command as baseline run again, against baseline: "
                     "a Gleaner ratio no further from ×1.00 than it is within what identical runs give here.")
    rows = []
    for workload in results["workloads"]:
        if workload.get("error"):
            continue
        cells = []
        for other in others:
            r = config_paired(workload, "gleaner", other)
            cells.append(f"×{r.median:.2f} [{r.low:.2f}, {r.high:.2f}]" if r else "–")
        best = best_static(workload, others)
        checks = [f"baseline: {target_check(config_paired(workload, 'gleaner'), BASELINE_MARGIN)}"]
        if best is not None and best != "baseline":
            checks.append(f"best ({best}): {target_check(config_paired(workload, 'gleaner', best), BEST_STATIC_MARGIN)}")
        elif best == "baseline":
            checks.append("best: baseline")
        for c in controls:
            r = config_paired(workload, c)
            cells.append(f"×{r.median:.2f} [{r.low:.2f}, {r.high:.2f}]" if r else "–")
        rows.append([workload["name"]] + cells + ["; ".join(checks)])
    header = ["gleaner vs"] + others + [f"{c} vs baseline" for c in controls] + ["targets"]
    return lines + _table(header, rows) + [""]


def markdown(results: dict) -> str:
    """The full Markdown report for one suite run."""
    configs = [config["name"] for config in results["configs"] if config["status"] == "ran"]
    lines = [f"# Gleaner benchmark: suite `{results['suite']}`", ""]
    lines.append(f"Started {results['started']}, finished {results.get('finished', '(unfinished)')}; "
                 f"{results['reps']} repetitions per configuration, interleaved.")
    lines.append("")
    host = results["host"]
    lines.append(f"Host: {host['nproc']} vCPUs, kernel {host['kernel']}, cpuidle driver `{host['cpuidle_driver']}`; "
                 f"commit `{host.get('commit', 'not recorded')}`.")
    load = results["load"]
    if load["warning"]:
        lines.append(f"**WARNING: 1-minute load average was {load['before'][0]:.2f} (> {load['threshold']}) "
                     "before the suite — the machine was busy; treat these numbers as noise, not evidence.**")
    else:
        lines.append(f"1-minute load average before the suite: {load['before'][0]:.2f}.")
    if results["reps"] < 5:
        lines.append(f"**Only {results['reps']} repetition(s): a smoke test, not a measurement.**")
    lines.append(f"Idle transitions source: {results['idle_source']}.")
    lines.append("")
    lines.append("Cells: median [min–max] of the metric, ×speedup of the median over baseline "
                 "(>1 is better, whatever the metric's direction).")
    lines.append("")
    rows = []
    for workload in results["workloads"]:
        direction = "↑" if workload["higher_is_better"] else "↓"
        label = f"{workload['name']} ({workload['unit']} {direction})"
        if workload.get("error"):
            rows.append([label] + [f"not run: {workload['error']}"] + ["" for _ in configs[1:]])
            continue
        rows.append([label] + [_cell(workload["summary"][config]) for config in configs])
    lines += _table(["workload"] + configs, rows)
    lines.append("")
    if "gleaner" in configs and "baseline" in configs:
        lines += _gleaner_against_static(results, configs)
    lines.append("Idle transitions per second per vCPU (median over runs of the mean over vCPUs):")
    lines.append("")
    idle_rows = []
    for workload in results["workloads"]:
        if workload.get("error"):
            continue
        idle_rows.append([workload["name"]] + [
            format_value(rate) if (rate := workload["summary"][config]["idle_per_s_per_vcpu"]) is not None else "–"
            for config in configs
        ])
    lines += _table(["workload"] + configs, idle_rows)
    lines.append("")
    lines.append("Configurations:")
    lines.append("")
    for config in results["configs"]:
        status = "" if config["status"] == "ran" else f" — **{config['status']}: {config['reason']}**"
        lines.append(f"- `{config['name']}`: {config['description']}{status}")
    lines.append("")
    lines.append("Workloads:")
    lines.append("")
    for workload in results["workloads"]:
        lines.append(f"- `{workload['name']}`: {workload['description']}; metric {workload['metric']} "
                     f"({workload['unit']}, {'higher' if workload['higher_is_better'] else 'lower'} is better)")
    failures = [
        f"- {workload['name']} / {run['config']} rep {run['rep']}: {run['error']}"
        for workload in results["workloads"]
        for run in workload["runs"]
        if not run["ok"]
    ]
    if failures:
        lines += ["", "Failed runs:", ""] + failures
    if results.get("plots"):
        lines += ["", "Plots:", ""] + [f"- `{name}`" for name in results["plots"]]
    if results.get("notes"):
        lines += ["", "Notes:", ""] + [f"- {note}" for note in results["notes"]]
    return "\n".join(lines) + "\n"


def paired_pairs(values: dict[str, dict[int, float]], combos: list[tuple[str, str]],
                 higher_is_better: bool = True) -> dict[str, dict]:
    """For the one-workload scripts (progress_judge.py, quiet_start.py): each `(mine, other)`
    of `combos` paired by round, as `{"mine / other": {n, median, low, high}}`; a combination
    without a pair is left out."""
    pairs = {}
    for mine, other in combos:
        r = paired_ratio(values[mine], values[other], higher_is_better=higher_is_better)
        if r:
            pairs[f"{mine} / {other}"] = {"n": r.n, "median": r.median, "low": r.low, "high": r.high}
    return pairs


def paired_table(pairs: dict[str, dict]) -> list[str]:
    """[`paired_pairs`] as Markdown lines, a blank line first."""
    md = ["", "| paired ratio (>1: the first is faster) | median [95 % interval] | pairs |", "|---|---|---|"]
    for k, r in pairs.items():
        md.append(f"| {k} | ×{r['median']:.3f} [{r['low']:.3f}, {r['high']:.3f}] | {r['n']} |")
    return md


def summary_row(config: str, s: dict, extra: str) -> str:
    """One configuration's Markdown row in the one-workload scripts: its median (min–max)
    rate, then the script's own columns (`extra`, already joined with " | ")."""
    return f"| {config} | {s['median']:.0f} ({s['min']:.0f}–{s['max']:.0f}) | {extra} |"


def finish_markdown(path, md: list[str], pairs: dict[str, dict]) -> None:
    """Appends [`paired_table`] of `pairs` to `md`, writes it to `path` and prints it."""
    md = md + paired_table(pairs)
    path.write_text("\n".join(md) + "\n")
    print("\n".join(md))
