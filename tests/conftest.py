"""Make the collection importable as ansible_collections.llmgw.fleet and the lab as pve_lab."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(REPO, ".build", "collections")
LINK = os.path.join(COLLECTIONS, "ansible_collections", "llmgw", "fleet")

if not os.path.lexists(LINK):
    os.makedirs(os.path.dirname(LINK), exist_ok=True)
    os.symlink(os.path.relpath(REPO, os.path.dirname(LINK)), LINK)

for path in (COLLECTIONS, os.path.join(REPO, "tests", "lab")):
    if path not in sys.path:
        sys.path.insert(0, path)
os.environ.setdefault("ANSIBLE_COLLECTIONS_PATH", COLLECTIONS)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "heavy: a fault row (a node lost, powered off or partitioned) or a lab self-test that a lighter "
                   "end-to-end test already covers: `make faults` runs them, `make test` leaves them out")
