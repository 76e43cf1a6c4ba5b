"""Puts bench/ on sys.path so tests import the harness package as run.py does."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
