#!/usr/bin/env python3
# Superseded by ../overhead-window-budget-2026-11-25/ab.py: the same protocol, with two more
# optional keys (PRE, BIN). Kept so that the commands in README.md here still run as written.
import os, runpy
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            '../overhead-window-budget-2026-11-25/ab.py'), run_name='__main__')
