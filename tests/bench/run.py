"""`make bench`: every benchmark of the collection, each printing figures as ratios against a baseline measured in
the same run. `--quick` runs each on its smallest size, for CI.

Figures so far: placement (solve time, replicas placed vs first-fit decreasing). The CPU-model cost, add_node and
replacement figures are still to come (see docs/placement.md for the placement figures).
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHES = ["bench_placement.py"]


def main():
    args = sys.argv[1:]
    worst = 0
    for bench in BENCHES:
        print("== " + bench, flush=True)
        worst = max(worst, subprocess.call([sys.executable, os.path.join(HERE, bench)] + args))
    return worst


if __name__ == "__main__":
    sys.exit(main())
