#!/usr/bin/env python3
"""Wake-up lateness probe: a thread at nice -10 sleeping to absolute 10 ms deadlines.

Why: when the soak reports late control periods, this tells the machine's scheduling apart
from Gleaner's own work. Run it beside `tests/soak.sh`; if it never wakes much later than
its deadline while Gleaner does, the delay is inside Gleaner's loop.

Usage: tests/latprobe.py SECONDS [LOG]   (root for nice -10; LOG defaults to stdout)
Prints one line per wake-up more than 50 ms late, and the worst lateness at the end.
"""
import os
import sys
import time


def main():
    seconds = float(sys.argv[1])
    out = open(sys.argv[2], "w", buffering=1) if len(sys.argv) > 2 else sys.stdout
    try:
        os.nice(-10)
    except PermissionError:
        out.write("latprobe: not root: running at nice 0\n")
    end = time.monotonic() + seconds
    deadline = time.monotonic()
    worst = 0.0
    while time.monotonic() < end:
        deadline += 0.01
        wait = deadline - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        late = time.monotonic() - deadline
        if late > 0.05:
            out.write(f"{time.strftime('%H:%M:%S', time.gmtime())} late_ms={late * 1000:.0f}\n")
            deadline = time.monotonic()
        worst = max(worst, late)
    out.write(f"done worst_ms={worst * 1000:.0f}\n")


if __name__ == "__main__":
    main()
