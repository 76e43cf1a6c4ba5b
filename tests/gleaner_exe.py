"""Finds the gleaner binary for the scripts in tests/ (kill test, soak test).

Why a module: the kill and soak tests must test the same binary by the same rule, so the rule
lives in one place: $GLEANER_BIN if set, else the workspace's debug build, else its release
build.
"""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def gleaner_bin(prog: str) -> str:
    """Path of the gleaner binary to test; exits naming the fix when there is none."""
    exe = os.environ.get("GLEANER_BIN")
    if exe:
        return exe
    for path in (REPO / "target/debug/gleaner", REPO / "target/release/gleaner"):
        if path.exists():
            return str(path)
    sys.exit(f"{prog}: no gleaner binary: run `cargo build -p gleaner` or set GLEANER_BIN")
