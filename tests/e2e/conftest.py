import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Files that must not run beside each other under `pytest -n N --dist loadgroup` (tests/suite.py): their fixtures
# clean up the same VMs (pve_vm_e2e.lab_session: the pve-* names and VMIDs 1200-1239).
SHARED_GROUPS = {"test_pve_vm.py": "pve_vm", "test_pve_vm_refusals.py": "pve_vm",
                 "test_proxmox_client_lab.py": "pve_vm"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Each file is one xdist group (its module fixtures hold a lab fleet of its own), bar SHARED_GROUPS."""
    for item in items:
        name = os.path.basename(str(item.fspath))
        item.add_marker(pytest.mark.xdist_group(SHARED_GROUPS.get(name, name)))
