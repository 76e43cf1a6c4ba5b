"""Gleaner benchmark harness: suites, interleaved runs, tables and plots (see bench/README.md)."""
