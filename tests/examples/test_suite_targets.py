"""Every heavy row runs somewhere: `make test` leaves out the rows marked heavy, so each end-to-end or lab file
that holds one must be in `make faults` (tests/suite.py's FAULT_ARGS), or its heavy rows would run in no target."""

import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests"))
import suite  # noqa: E402  (tests/suite.py, the targets' stages)


def heavy_files():
    for path in sorted(glob.glob(os.path.join(REPO, "tests", "e2e", "test_*.py")) +
                       glob.glob(os.path.join(REPO, "tests", "lab", "tests", "test_*.py"))):
        with open(path) as handle:
            if "mark.heavy" in handle.read():
                yield os.path.relpath(path, REPO)


def test_every_file_with_a_heavy_row_is_in_make_faults():
    files = list(heavy_files())
    assert "tests/e2e/test_upgrade_engine.py" in files and "tests/e2e/test_drain_node.py" in files
    assert sorted(set(files) - set(suite.FAULT_ARGS)) == []
