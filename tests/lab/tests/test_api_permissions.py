"""Privileges of the privilege-separated token `llmgw@pve!fleet`, checked as PVE checks them.

Sources (qemu-server e6352be6, src/PVE/API2/Qemu.pm): clone_vm's `permissions` (VM.Clone on /vms/{vmid}, VM.Allocate
on /vms/{newid}) and $check_storage_access_clone (Datastore.AllocateSpace on each disk's storage), check_bridge_access
(SDN.Use on /sdn/zones/localnetwork/BRIDGE), $check_vm_modify_config_perm (cpu/memory/options keys; cloud-init keys
and ipconfigN need VM.Config.Cloudinit or VM.Config.Network), $check_drive_perms (a cloud-init drive needs
VM.Config.Cloudinit and VM.Config.CDROM). pve-access-control's RPCEnvironment: raise_perm_exc's text,
"Permission check failed (PATH, PRIV)", "PATH, A|B" where any one privilege would do.
"""

import os
import re

import pytest
import requests
from proxmoxer import ProxmoxAPI, ResourceException

from pve_lab.api.permissions import DOCS_ROLE

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class Acl:
    def __init__(self, conn):
        self.url = "https://%s:%d/lab/acl" % (conn["api_host"], conn["api_port"])
        self.ca = conn["ca_cert"]

    def grant(self, grants):
        answer = requests.post(self.url, json={"grants": grants}, verify=self.ca, timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.json()["data"]

    def without(self, *privs):
        """The docs role on /, less the privileges named."""
        return self.grant({"/": sorted(DOCS_ROLE - set(privs))})

    def reset(self):
        requests.delete(self.url, verify=self.ca, timeout=30).raise_for_status()


@pytest.fixture
def acl(conn):
    helper = Acl(conn)
    helper.reset()
    yield helper
    helper.reset()


@pytest.fixture(scope="session")
def fleet(conn):
    user, token = str(conn["fleet_token_id"]).split("!")
    return ProxmoxAPI(conn["api_host"], port=conn["api_port"], user=user, token_name=token,
                      token_value=conn["fleet_token_secret"], verify_ssl=conn["ca_cert"], timeout=60)


def refused(call):
    with pytest.raises(ResourceException) as caught:
        call()
    assert caught.value.status_code == 403, caught.value
    return caught.value.content


def test_the_default_grant_is_the_role_docs_real_proxmox_tells_operators_to_create():
    with open(os.path.join(REPO, "docs", "real-proxmox.md")) as handle:
        text = handle.read()
    match = re.search(r'pveum role add LLMGWFleet --privs "([^"]+)"', text.replace("\\\n", ""))
    assert match, "docs/real-proxmox.md has no `pveum role add LLMGWFleet` line"
    assert set(match.group(1).split()) == DOCS_ROLE


def test_the_docs_role_clones_configures_starts_stops_and_destroys(fleet, node, conn, vms, tasks, acl):
    api = fleet.nodes(conn["pve_node"])
    newid = vms.track(vms.free_id())
    tasks.ok(api.qemu(conn["template_vmid"]).clone.post(newid=newid, name="lp-docs-role"))
    tasks.ok(api.qemu(newid).config.post(cores=2, memory=1024, ciuser="ops", ipconfig0="ip=dhcp", onboot=1, cpu="host"))
    assert api.qemu(newid).config.get()["cores"] == 2
    tasks.ok(api.qemu(newid).status.start.post())
    tasks.ok(api.qemu(newid).status.stop.post())
    tasks.ok(api.qemu(newid).delete())
    assert newid not in {vm["vmid"] for vm in node.qemu.get()}


@pytest.mark.parametrize("missing, text", [
    ("VM.Clone", "Permission check failed (/vms/{template}, VM.Clone)"),
    ("VM.Allocate", "Permission check failed (/vms/{newid}, VM.Allocate)"),
    ("Datastore.AllocateSpace", "Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)"),
    ("SDN.Use", "Permission check failed (/sdn/zones/localnetwork/vmbr0, SDN.Use)"),
])
def test_a_clone_without_a_privilege_is_refused_before_anything_is_made(fleet, node, conn, vms, acl, missing, text):
    acl.without(missing)
    newid = vms.free_id()
    content = refused(lambda: fleet.nodes(conn["pve_node"]).qemu(conn["template_vmid"]).clone.post(newid=newid))
    assert content == text.format(template=conn["template_vmid"], newid=newid)
    assert newid not in {vm["vmid"] for vm in node.qemu.get()}


def test_config_and_power_refusals_name_the_privilege(fleet, conn, vms, acl):
    vmid = vms.clone(name="lp-refusals")
    api = fleet.nodes(conn["pve_node"])
    path = "/vms/%d" % vmid
    acl.without("VM.Config.CPU", "VM.PowerMgmt", "VM.Config.CDROM")
    assert refused(lambda: api.qemu(vmid).config.post(cores=2)) == "Permission check failed (%s, VM.Config.CPU)" % path
    assert refused(api.qemu(vmid).status.start.post) == \
        "Permission check failed (%s, VM.PowerMgmt)" % path
    # a cloud-init drive: VM.Config.Cloudinit and VM.Config.CDROM, not VM.Config.Disk
    assert refused(lambda: api.qemu(vmid).config.post(ide3="local-lvm:cloudinit")) == \
        "Permission check failed (%s, VM.Config.CDROM)" % path
    acl.without("VM.Config.Cloudinit", "VM.Config.Network")
    assert refused(lambda: api.qemu(vmid).config.post(ciuser="ops")) == \
        "Permission check failed (%s, VM.Config.Cloudinit|VM.Config.Network)" % path
    acl.without("VM.Config.Cloudinit")
    api.qemu(vmid).config.put(ciuser="ops")  # VM.Config.Network is the alternative
    assert api.qemu(vmid).config.get()["ciuser"] == "ops"


def test_lists_show_only_what_the_token_may_audit(fleet, node, conn, vms, acl):
    vmid = vms.clone(name="lp-hidden")
    acl.grant({"/": sorted(DOCS_ROLE), "/vms/%d" % vmid: ["VM.PowerMgmt"], "/storage/local-lvm": ["SDN.Use"]})
    api = fleet.nodes(conn["pve_node"])
    assert vmid not in {vm["vmid"] for vm in api.qemu.get()}
    assert vmid not in {int(r["vmid"]) for r in fleet.cluster.resources.get(type="vm")}
    assert "local-lvm" not in {s["storage"] for s in api.storage.get()}
    assert refused(api.qemu(vmid).config.get) == "Permission check failed (/vms/%d, VM.Audit)" % vmid
    assert vmid in {vm["vmid"] for vm in node.qemu.get()}  # root's token sees it


def test_access_permissions_reports_what_the_token_holds_at_a_path(fleet, api, acl):
    acl.grant({"/vms": ["VM.Audit"], "/vms/1300": ["VM.Audit", "VM.PowerMgmt"]})
    assert fleet.access.permissions.get(path="/vms/1300") == {"/vms/1300": {"VM.Audit": 1, "VM.PowerMgmt": 1}}
    assert fleet.access.permissions.get(path="/vms/1301") == {"/vms/1301": {"VM.Audit": 1}}
    assert fleet.access.permissions.get(path="/storage/local-lvm") == {}
    assert "VM.Allocate" in api.access.permissions.get(path="/vms/1300")["/vms/1300"]  # root's token: everything


def test_another_users_task_needs_sys_audit(fleet, node, conn, vms, acl):
    vmid = vms.clone(name="lp-task")
    upid = node.qemu(vmid).status.start.post()  # root's token started it
    api = fleet.nodes(conn["pve_node"])
    acl.without("Sys.Audit")
    assert refused(api.tasks(upid).status.get) == "Permission check failed (/nodes/%s, Sys.Audit)" % \
        conn["pve_node"]
    acl.reset()
    assert api.tasks(upid).status.get()["upid"] == upid
    node.qemu(vmid).status.stop.post()


def test_an_unknown_privilege_is_refused_by_the_lab(conn):
    answer = requests.post("https://%s:%d/lab/acl" % (conn["api_host"], conn["api_port"]),
                           json={"grants": {"/": ["VM.Everything"]}}, verify=conn["ca_cert"], timeout=30)
    assert answer.status_code == 400 and "VM.Everything" in answer.json()["message"]
