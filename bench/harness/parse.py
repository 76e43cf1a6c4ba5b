"""Extracting one number per run from each tool's report, and reading gleaner timelines.

Each parser looks for a specific, anchored line so that extra output from a wrapper
(`gleaner run` logging to stderr, for instance) cannot be mistaken for the metric.
A report without the expected line raises ParseError quoting the missing pattern.
"""

from __future__ import annotations

import json
import re
from pathlib import Path


class ParseError(Exception):
    """A tool's output did not contain the expected metric."""


_SYSBENCH_TOTAL_TIME = re.compile(r"^\s*total time:\s+([0-9.]+)s\s*$", re.MULTILINE)
_SYSBENCH_EVENTS = re.compile(r"^\s*total number of events:\s+(\d+)\s*$", re.MULTILINE)
_SYSBENCH_TPS = re.compile(r"^\s*transactions:\s+\d+\s+\(([0-9.]+) per sec\.\)\s*$", re.MULTILINE)


def _search(pattern: re.Pattern[str], text: str, what: str) -> str:
    match = pattern.search(text)
    if not match:
        raise ParseError(f"no '{what}' line in the output")
    return match.group(1)


def sysbench_total_time(text: str) -> float:
    """Seconds a fixed-work sysbench test (e.g. mutex) took."""
    return float(_search(_SYSBENCH_TOTAL_TIME, text, "total time:"))


def sysbench_events_per_s(text: str) -> float:
    """Events per second of a time-bounded sysbench test (e.g. threads)."""
    seconds = sysbench_total_time(text)
    events = int(_search(_SYSBENCH_EVENTS, text, "total number of events:"))
    if seconds <= 0:
        raise ParseError(f"sysbench reported a total time of {seconds} s")
    return events / seconds


def sysbench_transactions_per_s(text: str) -> float:
    """Transactions per second from a sysbench OLTP run."""
    return float(_search(_SYSBENCH_TPS, text, "transactions: N (X per sec.)"))


def stress_ng_bogo_ops_per_s(text: str, stressor: str) -> float:
    """Real-time bogo ops/s of `stressor` from `stress-ng --metrics-brief`."""
    # stress-ng: metrc: [pid] futex  308375  1.00  0.29  1.70  308177.19  154619.20
    pattern = re.compile(
        rf"^stress-ng: \w+:\s+\[\d+\]\s+{re.escape(stressor)}\s+\d+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+)\s",
        re.MULTILINE,
    )
    return float(_search(pattern, text + "\n", f"{stressor} <bogo ops> ... <bogo ops/s>"))


def last_json_object(text: str, with_key: str | None = None) -> dict:
    """The last line of `text` that parses as a JSON object (having `with_key`, if given).

    `with_key` keeps a wrapper's own JSON lines (e.g. from `gleaner run`) from being
    taken for the workload's report.
    """
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict) and (with_key is None or with_key in value):
                return value
    raise ParseError(f"no JSON object line{f' with {with_key!r}' if with_key else ''} in the output")


def json_number(report: dict, key: str) -> float:
    """`report[key]` as a float; the error lists the keys that were there."""
    value = report.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ParseError(f"workload JSON has no numeric '{key}' (keys: {', '.join(sorted(report))})")
    return float(value)


TIMELINE_FIELDS = ("t_s", "active", "n_active")


def compact_timeline(rows: list[dict]) -> list[dict]:
    """The documented fields, and of the rest only what says why a run went as it did: the
    held vCPUs where any were held and the policy's events where it had any, each as "kind
    field=value: reason". Per-run timelines stay small in the results JSON (events come a few per run),
    yet a run that never consolidated says whether it held instead or what stopped it: the
    suite's timelines of active sets alone could not tell (a ping-pong left unpacked in one
    of twelve runs on 2026-11-28). Also each period's utilization and g_comp, rounded, where
    the row has them: what the policy's tests judge (a ping-pong's packing undone by one
    window's g_comp, 2026-11-28 on a `none` guest, showed only in by-hand timelines)."""
    compact = []
    for row in rows:
        kept = {key: row[key] for key in TIMELINE_FIELDS}
        c = row.get("characteristics")
        if isinstance(c, dict):
            if isinstance(c.get("total_util"), (int, float)):
                kept["util"] = round(c["total_util"], 2)
            if isinstance(c.get("g_comp_ns"), (int, float)):
                kept["g_comp_us"] = round(c["g_comp_ns"] / 1e3, 1)
        if row.get("retaining"):
            kept["retaining"] = row["retaining"]
        events = [_event_text(event) for event in row.get("events") or [] if isinstance(event, dict)]
        if events:
            kept["events"] = events
        compact.append(kept)
    return compact


def _event_text(event: dict) -> str:
    """A policy event of the timeline (`{"period": N, "kind": "deactivate", "cpu": 1,
    "reason": "..."}`) as "deactivate cpu=1: reason"."""
    fields = [f"{key}={value}" for key, value in event.items() if key not in ("period", "kind", "reason")]
    return f"{' '.join([str(event.get('kind', 'event')), *fields])}: {event.get('reason', '')}"


def read_timeline(path: Path) -> list[dict]:
    """Rows of a `gleaner run --timeline` JSONL file: t_s, n_active, active (+ extras).

    Rows missing the three required fields are reported, not silently dropped: a
    timeline that does not match the documented format is a bug in one of the sides.
    """
    rows = []
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise ParseError(f"cannot read timeline {path}: {error}") from error
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ParseError(f"{path}:{number}: not JSON ({error.msg})") from error
        if not isinstance(row, dict) or not all(key in row for key in TIMELINE_FIELDS):
            raise ParseError(f"{path}:{number}: expected an object with t_s, active, n_active")
        rows.append(row)
    return rows
