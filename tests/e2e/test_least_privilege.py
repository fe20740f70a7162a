"""add_node with the least-privilege API token of docs/real-proxmox.md, on the lab, which checks privileges as PVE
does (tests/lab/pve_lab/api/permissions.py, tests/lab/tests/test_api_permissions.py):

* with exactly the documented role (`llmgw@pve!fleet`, the lab's default grant): the node goes to ready;
* with one privilege taken away (VM.Clone on the template; VM.PowerMgmt on the node's own VMID, which the run needs
  only after the clone): the run fails before any write, naming the privilege, the path and what it was for; no VM
  of that name exists and the token started no task; with the privilege granted again, the next run makes the node
  ready.

Nodes lp-node01/02 at 10.77.0.125-126 (VMIDs 1125-1126, outside the pve_vm tests' 1200-1239), destroyed before and
after.
"""

import time

import pytest
import requests
from helpers import run_playbook
from onboard_e2e import INVENTORY, Controller, lab_engine, lab_with_own_vms
from pve_vm_e2e import lab_is_up
from registry_check import violations

from pve_lab.api.permissions import DOCS_ROLE

pytestmark = pytest.mark.skipif(not lab_is_up(), reason="the lab is not up (make lab-up)")

PREFIX, OWN_VMIDS = "lp-", range(1125, 1127)
OPTIONS = {"fabric": "ib-a", "gpus": 2, "gpu_type": "sim"}


class Acl:
    def __init__(self, lab):
        self.url = "https://%s:%s/lab/acl" % (lab.data["api_host"], lab.data["api_port"])
        self.ca = lab.data["ca_cert"]

    def call(self, method, payload=None):
        answer = requests.request(method, self.url, json=payload, verify=self.ca, timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.json()["data"]


@pytest.fixture(scope="module")
def lab():
    yield from lab_with_own_vms(PREFIX, OWN_VMIDS)


@pytest.fixture
def acl(lab):
    helper = Acl(lab)
    helper.call("DELETE")
    yield helper
    helper.call("DELETE")


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    return Controller(tmp_path_factory.mktemp("least-privilege"), lab_engine())


def fleet_token(lab):
    """fleet_proxmox with the lab's privilege-separated token instead of root's."""
    return {"fleet_proxmox": {"api_host": lab.data["api_host"], "api_port": lab.data["api_port"],
                              "api_token_id": lab.data["fleet_token_id"],
                              "api_token_secret": lab.data["fleet_token_secret"], "ca_path": lab.data["ca_cert"]}}


def add_node(lab, controller, node, octet):
    return run_playbook("llmgw.fleet.add_node", controller.extra_vars(node, octet, **OPTIONS, **fleet_token(lab)),
                        inventory=INVENTORY)


def assert_ready(lab, controller, node, run):
    assert not run.failed, "\n".join(str(m) for m in run.failure_messages())
    assert controller.record(node)["state"] == "ready"
    assert len([g for g in lab.client.qemu_vms() if g.get("name") == node]) == 1
    assert violations(controller.registry) == []


def test_the_documented_role_is_enough_for_add_node(lab, controller, acl):
    assert set(acl.call("GET")["/"]) == DOCS_ROLE
    run = add_node(lab, controller, "lp-node01", 125)
    assert_ready(lab, controller, "lp-node01", run)


@pytest.mark.parametrize("taken, grants, fragment", [
    ("VM.Clone", {"/": sorted(DOCS_ROLE - {"VM.Clone"})}, "lacks VM.Clone on /vms/{template} (cloning the template)"),
    # needed only after the clone: without the check before the first write, PVE's 403 would leave a VM half-made
    ("VM.PowerMgmt on the node's VMID", {"/": sorted(DOCS_ROLE), "/vms/1126": sorted(DOCS_ROLE - {"VM.PowerMgmt"})},
     "lacks VM.PowerMgmt on /vms/1126 (starting it)"),
])
def test_a_missing_privilege_stops_the_run_before_any_write_and_names_it(lab, acl, tmp_path, taken, grants, fragment):
    node, octet = "lp-node02", 126
    controller = Controller(tmp_path, lab_engine())
    acl.call("POST", {"grants": grants})
    started = int(time.time())
    run = add_node(lab, controller, node, octet)
    assert run.failed
    text = "\n".join(str(m) for m in run.failure_messages() if m)
    assert "%s: the API token (or user) %s" % (node, fragment.format(template=lab.data["template_vmid"])) in text, text
    assert "Nothing was changed" in text
    assert [g for g in lab.client.qemu_vms() if g.get("name") == node] == []
    # Every write pve_vm makes is a task; the token's own since the run started (other tests use root's token):
    tasks = [t for t in lab.client.get("nodes/%s/tasks" % lab.node, userfilter="llmgw@pve", source="all", limit=500)
             if int(t["starttime"]) >= started]
    assert tasks == [], tasks
    record = controller.record(node)
    assert record is None or record["state"] != "ready", record
    print("\nleast privilege: without %s, add_node stopped before any write: %s" % (taken, text.splitlines()[0][:300]))
    acl.call("DELETE")
    assert_ready(lab, controller, node, add_node(lab, controller, node, octet))
    lab.destroy(lab.vm(node)["vmid"])  # the next row starts from nothing
