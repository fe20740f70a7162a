"""What every benchmark hands to tests/bench/run.py: figures, each a measurement beside the baseline it is compared
with in the same run, the parameters that produced it and a one-line reading.

A benchmark writes ``{"figures": [...], "skipped": [...]}`` to the path given with ``--json``; run.py prints one
table of all of them at the end.
"""

import importlib.util
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS = os.path.join(REPO, ".build", "collections")
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)


def figure(name, measured, baseline, ratio, params, reading):
    """One row of the table. ``measured``/``baseline`` are short texts with their units (e.g. "57.1 tok/s");
    ``ratio`` is a float (measured over baseline, or baseline over measured where said) or None."""
    return {"figure": name, "measured": measured, "baseline": baseline, "ratio": ratio, "params": params,
            "reading": reading}


class Report:
    """Collects figures and skip lines; written as JSON for run.py, printed as it goes for a person."""

    def __init__(self, bench):
        self.bench = bench
        self.figures = []
        self.skipped = []
        self.started = time.monotonic()

    def add(self, name, measured, baseline, ratio, params, reading):
        row = figure(name, measured, baseline, ratio, params, reading)
        self.figures.append(row)
        print("  %s: %s vs %s%s  [%s]\n    -> %s" % (
            name, measured, baseline, "" if ratio is None else " = %.2fx" % ratio, params, reading), flush=True)

    def skip(self, name, why):
        self.skipped.append({"figure": name, "why": why})
        print("  %s: not measured: %s" % (name, why), flush=True)

    def write(self, path):
        if not path:
            return
        with open(path, "w") as handle:
            json.dump({"bench": self.bench, "seconds": round(time.monotonic() - self.started, 1),
                       "figures": self.figures, "skipped": self.skipped}, handle, indent=2)


def log(msg):
    print("  . " + msg, flush=True)


def lab_script(name):
    """A script of tests/lab/engine/ loaded as a module."""
    path = os.path.join(REPO, "tests", "lab", "engine", name + ".py")
    spec = importlib.util.spec_from_file_location("engine_" + name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lab_engine():
    """The lab engine, {dir, archive, sha256, version, variants}: tests/lab/engine/build.py, cached per machine
    (seconds when cached; the first call on a fresh machine builds it)."""
    return lab_script("build").build()
