"""The host's view of each guest: CPU time and context switches of QEMU's vCPU threads.

Why it exists: what retention and consolidation change on the host (vCPU threads that keep or
give back their physical CPU) is visible only from outside the guest, in /proc/<qemu>/task.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class ThreadStats:
    cpu_s: float
    voluntary_switches: int
    involuntary_switches: int


def _vcpu_threads(proc_root: Path, pid: int) -> list[tuple[str, str]]:
    """(tid, comm) of each QEMU vCPU thread ("CPU n/..."), in tid order.

    QEMU names its threads when started with `-name ...,debug-threads=on`. Threads that exit
    between listing and reading are skipped.
    """
    task_dir = proc_root / str(pid) / "task"
    try:
        tids = sorted(os.listdir(task_dir))
    except OSError:
        return []
    threads = []
    for tid in tids:
        try:
            comm = (task_dir / tid / "comm").read_text().strip()
        except OSError:
            continue
        if comm.startswith("CPU "):
            threads.append((tid, comm))
    return threads


def vcpu_thread_ids(proc_root: Path, pid: int) -> dict[int, int]:
    """Thread id of each QEMU vCPU thread, keyed by the vCPU's index ("CPU 3/TCG" -> 3)."""
    ids = {}
    for tid, comm in _vcpu_threads(proc_root, pid):
        index = comm.removeprefix("CPU ").split("/", 1)[0]
        if index.isdigit():
            ids[int(index)] = int(tid)
    return ids


def read_thread_stats(proc_root: Path, pid: int) -> dict[str, ThreadStats]:
    """CPU time and context switches of each QEMU vCPU thread, keyed by its name ("CPU 0/TCG")."""
    stats = {}
    task_dir = proc_root / str(pid) / "task"
    for tid, comm in _vcpu_threads(proc_root, pid):
        try:
            stat = (task_dir / tid / "stat").read_text()
            status = (task_dir / tid / "status").read_text()
        except OSError:
            continue
        # Fields after the parenthesised comm; utime and stime are fields 14 and 15.
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu_s = (int(fields[11]) + int(fields[12])) / CLK_TCK
        switches = {}
        for line in status.splitlines():
            key, _, value = line.partition(":")
            if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                switches[key] = int(value)
        stats[comm] = ThreadStats(
            cpu_s,
            switches.get("voluntary_ctxt_switches", 0),
            switches.get("nonvoluntary_ctxt_switches", 0),
        )
    return stats


def stats_delta(before: dict[str, ThreadStats], after: dict[str, ThreadStats]) -> dict[str, dict]:
    out = {}
    for name, end in sorted(after.items()):
        start = before.get(name, ThreadStats(0.0, 0, 0))
        out[name] = {
            "cpu_s": round(end.cpu_s - start.cpu_s, 3),
            "voluntary_switches": end.voluntary_switches - start.voluntary_switches,
            "involuntary_switches": end.involuntary_switches - start.involuntary_switches,
        }
    return out
