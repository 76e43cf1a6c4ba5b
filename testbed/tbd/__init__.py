"""Oversubscribed test bed driver: real Linux guests under QEMU (TCG) sharing this machine's CPUs.

Why it exists: Gleaner's largest effects (paper Table 1 "Shared", §7.2, Figures 7-9) appear
when two VMs time-share the physical CPUs. We cannot change this machine's host, but we can
be the host: QEMU's multi-threaded TCG runs each vCPU as a host thread that this machine's
scheduler time-shares. The driver boots the guests of an experiment file once per case,
then runs interleaved repetitions of "Gleaner off" and "Gleaner on" inside them, starting
the workloads of all guests at the same moment through the guest agent on each serial
console (testbed/guest/init), and records per run each guest's workload report and each
QEMU vCPU thread's CPU time and context switches, then writes per-guest speedups, the
paper's weighted speedup, a Markdown summary and a plot under testbed/results/.

Modules, by job: experiment (the file), guest (QEMU processes), hostproc (the host's /proc
view of vCPU threads), lock (one run at a time; signals), runner (a run), summary (statistics
and plot, through the bench harness's `harness.stats` and `harness.plots`), cli (commands).
testbed/testbed.py is the entry point.
"""

import sys
from pathlib import Path

# The bench harness is not an installed package; its statistics and plots are shared from
# bench/ (as bench/run.py imports them).
_BENCH = str(Path(__file__).resolve().parent.parent.parent / "bench")
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)
