#!/usr/bin/env python3
"""Pool several batches of a suite: `python3 bench/pool.py results/daemon-*.json`.

Prints, per workload, each configuration's runs against the baseline run of the same round
(or another configuration's, `--against one-vcpu`),
pooled over every batch given (pairs kept), with the 95 % bootstrap interval of the median,
then every batch's own ratio. Batches of another cpuidle driver than the first's, and batches
that ran under a load warning, are left out and named.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.pool import PoolError, batch_of, markdown, pool  # noqa: E402


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/pool.py", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="results/<suite>-<date>.json files")
    parser.add_argument("--driver", help="pool the batches of this cpuidle driver (default: the first file's)")
    parser.add_argument("--configs", help="comma-separated configurations to show (default: every one but baseline)")
    parser.add_argument("--include-busy", action="store_true", help="keep batches that ran under a load warning")
    parser.add_argument("--against", default="baseline",
                        help="the configuration each run is paired with in its round (default baseline; "
                             "e.g. one-vcpu for Gleaner against ping-pong's best fixed setting)")
    args = parser.parse_args(argv)
    batches = []
    for path in args.files:
        try:
            results = json.loads(path.read_text())
            batches.append(batch_of(path.name, results))
        except OSError as error:
            print(f"bench/pool.py: cannot read {path}: {error.strerror}", file=sys.stderr)
            return 2
        except json.JSONDecodeError as error:
            print(f"bench/pool.py: {path} is not JSON ({error.msg}, line {error.lineno}); "
                  "pass the results/<suite>-<date>.json files bench/run.py writes", file=sys.stderr)
            return 2
        except PoolError as error:
            print(f"bench/pool.py: {error}", file=sys.stderr)
            return 2
    pooled = pool(batches, args.driver, args.include_busy, args.against)
    if pooled.used and not pooled.ratios:
        print(f"bench/pool.py: no round has both {args.against} and another configuration; "
              "name a configuration the batches ran with --against", file=sys.stderr)
        return 1
    if not pooled.used:
        print("bench/pool.py: no batch left to pool: " + "; ".join(f"{n}: {w}" for n, w in pooled.skipped)
              + " (see --driver, --include-busy)", file=sys.stderr)
        return 1
    configs = [c.strip() for c in args.configs.split(",") if c.strip()] if args.configs else None
    sys.stdout.write(markdown(pooled, configs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
