#!/usr/bin/env python3
"""Oversubscribed test bed: real Linux guests under QEMU (TCG) sharing this machine's CPUs.

Usage:
  testbed/testbed.py run testbed/experiments/fig7.toml       # the Figure 7 experiment
  testbed/testbed.py smoke                                    # one guest boots, runs under gleaner, powers off
  testbed/testbed.py summarize testbed/results/<run dir>      # redo tables/plot from runs.jsonl
Python 3.11+ standard library; matplotlib for the plot (skipped with a note if missing).
The driver is the package testbed/tbd/ (see its __init__.py); this file is its entry point.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tbd.cli import main  # noqa: E402 - the package's directory must be on the path first

if __name__ == "__main__":
    sys.exit(main())
