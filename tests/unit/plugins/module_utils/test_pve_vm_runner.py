"""pve_vm_runner on a fake Proxmox client: every refusal before the first write, check mode writing nothing,
check -> apply -> check -> apply, the diff, state absent, task errors, and the VMID rule. The unit form of
tests/e2e/test_pve_vm.py and tests/e2e/test_pve_vm_refusals.py."""

import inspect
import re

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils import _vm_info, _vm_runner_checks, pve_vm_runner
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_client import ProxmoxClient
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import ConfigChanged, NotFound, TaskFailed
from ansible_collections.llmgw.fleet.plugins.module_utils.pve_vm_runner import VMRefused, VMRequest, run_vm, vm_info
from ansible_collections.llmgw.fleet.plugins.module_utils.vm_plan import PlanError, encode_sshkeys
from ansible_collections.llmgw.fleet.tests.unit.plugins.module_utils.fake_pve_api import (
    DOCS_ROLE,
    NODE,
    TEMPLATE_CONFIG,
    TEMPLATE_NAME,
    TEMPLATE_VMID,
    FakeProxmoxClient,
    task_failed,
)

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE4pI0qvGKY5Ca7z0kk8r3Tqb7FEAPOWcUpCIkHNO2yl fleet@controller"
EXTRA_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHf2Bq1yYfZ1pPDdUjUZ5v0s8oYQz1m0vJ6Xv0bqM3xN second@fleet"
GATEWAY = "10.77.0.1"


@pytest.fixture
def cluster():
    fake = FakeProxmoxClient()
    fake.add_template()
    return fake


def request(name, octet, **extra):
    """The module's input for a fleet node at 10.77.0.<octet>/24 cloned from the template (as the e2e vm_args)."""
    args = dict(
        name=name,
        address="10.77.0.%d/24" % octet,
        gateway=GATEWAY,
        clone=TEMPLATE_NAME,
        ciuser="debian",
        sshkeys=KEY,
        nameserver=GATEWAY,
        cloudinit_storage="local-lvm",
        timeout=600,
    )
    args.update(extra)
    return VMRequest(**args)


def fleet_vm(cluster, name, octet, status="stopped", **config):
    """A VM as an earlier run of the module left it: the template's config plus the fleet's keys."""
    vmid = 1000 + octet
    conf = dict(TEMPLATE_CONFIG)
    conf.update(
        cpu="host",
        ciuser="debian",
        sshkeys=encode_sshkeys(KEY + "\n"),
        ipconfig0="ip=10.77.0.%d/24,gw=%s" % (octet, GATEWAY),
        nameserver=GATEWAY,
        ide2="local-lvm:vm-%d-cloudinit,media=cdrom" % vmid,
    )
    conf.update(config)
    return cluster.add_vm(vmid, name, config=conf, status=status)


def refused(cluster, req, fragments, error=VMRefused, nothing_changed=True):
    """Run ``req`` in check mode and for real: both raise ``error`` with every fragment, before any write."""
    before = cluster.snapshot()
    message = None
    for check in (True, False):
        del cluster.calls[:]
        with pytest.raises(error) as caught:
            run_vm(cluster, req, check_mode=check)
        message = str(caught.value)
        for fragment in fragments:
            assert fragment in message, (fragment, message)
        if nothing_changed:
            assert "Nothing was changed" in message
        assert cluster.writes == [], "a refused run (check=%s) wrote: %s" % (check, cluster.writes)
        assert cluster.snapshot() == before
    return message


def settled(cluster, req):
    """A check and an apply that both find nothing to do and write nothing; returns the apply's outcome."""
    before = cluster.snapshot()
    del cluster.calls[:]
    again = run_vm(cluster, req, check_mode=True)
    final = run_vm(cluster, req)
    for outcome in (again, final):
        assert outcome.changed is False, outcome.diff
        assert outcome.diff == {"before": {}, "after": {}}
    assert cluster.writes == []
    assert cluster.snapshot() == before
    return final


# ---- refusals: decided from reads only, so check mode and a real run both write nothing -----------------------


def test_vmid_used_under_another_name(cluster):
    fleet_vm(cluster, "holder", 221)
    refused(cluster, request("intruder", 224, vmid=1221),
            ["VMID 1221 (for 'intruder') is already used by VM 'holder' (VMID 1221 on node pve)",
             "'intruder' wanted, 'holder' found", "pass an explicit vmid"])


def test_vmid_derived_from_an_address_elsewhere_is_refused_when_a_container_holds_it(cluster):
    cluster.add_container(1221, "ct-holder")
    req = request("intruder", 221, address="10.78.0.221/24", gateway="10.78.0.1")  # same last octet, same VMID
    refused(cluster, req, ["VMID 1221", "container 'ct-holder'", "'intruder' wanted, 'ct-holder' found",
                           "Choose another address or vmid_base"])


@pytest.mark.parametrize(
    "extra, asked",
    [({}, "VMID 1225, derived from address 10.77.0.225/24 (vmid_base 1000)"), ({"vmid": 3000}, "vmid 3000")],
)
def test_name_that_exists_under_another_vmid(cluster, extra, asked):
    fleet_vm(cluster, "holder", 221)
    refused(cluster, request("holder", 225, **extra),
            ["name 'holder' exists as VM 'holder' (VMID 1221 on node pve)", "asks for " + asked, "pass vmid: 1221",
             "remove the old VM first (state: absent)"])


@pytest.mark.parametrize("state", ["present", "absent"])
def test_name_matching_several_vms(cluster, state):
    cluster.add_vm(1222, "twin", config=TEMPLATE_CONFIG)
    cluster.add_vm(1223, "twin", config=TEMPLATE_CONFIG, status="running")
    req = request("twin", 222) if state == "present" else VMRequest(name="twin", state="absent")
    refused(cluster, req, ["name 'twin' matches 2 VMs", "VM 'twin' (VMID 1222 on node pve)",
                           "VM 'twin' (VMID 1223 on node pve)", "Names must be unique"])


def test_address_used_by_another_vm(cluster):
    fleet_vm(cluster, "holder", 221)
    refused(cluster, request("newcomer", 221, vmid_base=2000),
            ["address 10.77.0.221 is already used by VM 'holder' (VMID 1221 on node pve) (its ipconfig0)",
             "Give 'newcomer' another address"])


@pytest.mark.parametrize("state", ["present", "absent"])
def test_name_of_the_template(cluster, state):
    refused(cluster, request(TEMPLATE_NAME, 226, state=state),
            ["name 'debian12-cloudinit' belongs to a template", "template 'debian12-cloudinit' (VMID 9000"])


def test_a_vm_removed_while_its_address_is_read_and_a_container_of_the_same_name_are_no_clash(cluster):
    fleet_vm(cluster, "leaving", 238)
    cluster.fail("vm_config", NotFound("HTTP 500: Configuration file 'nodes/pve/qemu-server/1238.conf' does not "
                                       "exist", status=500), vmid=1238)
    cluster.add_container(1300, "newcomer")
    outcome = run_vm(cluster, request("newcomer", 238, vmid_base=2000))
    assert outcome.result["vmid"] == 2238 and cluster.vms[2238].config["name"] == "newcomer"
    assert cluster.vms[1300].type == "lxc" and cluster.write_names() == ["clone_vm", "update_config"]


@pytest.mark.parametrize(
    "clone, fragments",
    [
        ("no-such-template", ["template 'no-such-template' to clone from does not exist"]),
        ("1221", ["VM 'holder' (VMID 1221 on node pve) is not a template", "convert it first"]),
        ("twin-template", ["template name 'twin-template' matches 2 VMs", "pass its VMID as clone"]),
    ],
)
def test_what_to_clone_from_must_be_one_template(cluster, clone, fragments):
    fleet_vm(cluster, "holder", 221)
    cluster.add_template(9001, "twin-template")
    cluster.add_template(9002, "twin-template")
    refused(cluster, request("orphan", 227, clone=clone), fragments)


def test_unknown_vm_without_address_or_vmid(cluster):
    refused(cluster, VMRequest(name="nowhere", clone=TEMPLATE_NAME),
            ["VM 'nowhere' does not exist and neither address nor vmid is given, so its VMID is unknown"])


def test_new_vm_without_template_on_a_cluster_of_several_nodes_needs_a_node():
    cluster = FakeProxmoxClient(nodes=("pve", "pve2"))
    refused(cluster, request("bare", 230, clone=None),
            ["the cluster has 2 nodes (pve, pve2)", "pass node (or PROXMOX_NODE) to say where 'bare' goes"])


def test_half_made_vm_still_locked_by_its_clone_is_reported_by_name(cluster):
    fleet_vm(cluster, "locked", 229).lock = "clone"
    refused(cluster, request("locked", 229, state="started", timeout=1),
            ["VM 'locked' (VMID 1229 on node pve) is still locked (clone) after 1s",
             "VM locked (1229) on node pve stayed locked (clone) for 1s", "interrupted run",
             "qm unlock 1229 && qm destroy 1229 --purge"])


def without(*privileges):
    """docs/real-proxmox.md's role on /, less ``privileges``."""
    return {"/": DOCS_ROLE - set(privileges)}


@pytest.mark.parametrize("lacking, fragment", [
    ("VM.Clone", "VM.Clone on /vms/9000 (cloning the template)"),
    ("VM.Allocate", "VM.Allocate on /vms/1230 (cloning the template)"),
    ("Datastore.AllocateSpace", "Datastore.AllocateSpace on /storage/local-lvm (the clone's scsi0)"),
    ("SDN.Use", "SDN.Use on /sdn/zones/localnetwork/vmbr0 (the clone's net0)"),
    ("VM.Config.CPU", "VM.Config.CPU on /vms/1230 (setting cpu)"),
    ("VM.PowerMgmt", "VM.PowerMgmt on /vms/1230 (starting it)"),
])
def test_a_new_vm_the_token_may_not_make_whole_is_refused_before_the_clone(cluster, lacking, fragment):
    cluster.grant(without(lacking))
    message = refused(cluster, request("lp", 230, state="started"),
                      ["lp: the API token (or user) lacks " + fragment, "docs/real-proxmox.md, step 3"])
    assert message.split(". Nothing", maxsplit=1)[0].count(" on /") == 1, message  # only what is missing is named


def test_a_template_without_a_cloud_init_drive_needs_cloudinit_and_cdrom_for_the_one_added(cluster):
    config = {k: v for k, v in TEMPLATE_CONFIG.items() if k != "ide2"}
    cluster.add_template(vmid=9001, name="bare", config=config)
    cluster.grant(without("VM.Config.CDROM"))
    refused(cluster, request("lp", 230, clone="bare"), ["VM.Config.CDROM on /vms/1230 (setting ide2)"])
    cluster.grant({"/": DOCS_ROLE})
    assert run_vm(cluster, request("lp", 230, clone="bare")).changed


def test_cloud_init_keys_accept_vm_config_network_instead(cluster):
    cluster.grant(without("VM.Config.Cloudinit", "VM.Config.Network"))
    refused(cluster, request("lp", 230), ["VM.Config.Cloudinit or VM.Config.Network on /vms/1230 (setting ciuser)"])
    cluster.grant(without("VM.Config.Cloudinit"))
    assert run_vm(cluster, request("lp", 230)).changed


def test_changes_to_an_existing_vm_and_its_removal_need_their_privileges(cluster):
    fleet_vm(cluster, "lp", 231, status="running")
    cluster.grant(without("VM.Config.Memory", "VM.PowerMgmt", "VM.Allocate"))
    refused(cluster, request("lp", 231, memory=4096), ["VM.Config.Memory on /vms/1231 (setting memory)"])
    refused(cluster, request("lp", 231, state="stopped"), ["VM.PowerMgmt on /vms/1231 (shutting it down)"])
    refused(cluster, request("lp", 231, state="absent"),
            ["VM.PowerMgmt on /vms/1231 (stopping it before removal); VM.Allocate on /vms/1231 (removing the VM)"])
    settled(cluster, request("lp", 231, state="started"))  # nothing to do needs nothing


def test_privileges_granted_on_deeper_paths_are_enough(cluster):
    cluster.grant({"/vms": DOCS_ROLE, "/storage/local-lvm": {"Datastore.AllocateSpace"},
                   "/sdn/zones/localnetwork/vmbr0": {"SDN.Use"}})
    assert run_vm(cluster, request("lp", 230, state="started")).changed
    cluster.grant({"/vms": DOCS_ROLE, "/vms/9000": {"VM.Audit"}, "/storage/local-lvm": {"Datastore.AllocateSpace"},
                   "/sdn/zones/localnetwork/vmbr0": {"SDN.Use"}})
    refused(cluster, request("lp2", 232), ["VM.Clone on /vms/9000"])


def test_a_new_vm_in_a_pool_may_use_what_the_token_holds_on_the_pool(cluster):
    others = {"/vms/9000": {"VM.Clone", "VM.Audit"}, "/storage/local-lvm": {"Datastore.AllocateSpace"},
              "/sdn/zones/localnetwork/vmbr0": {"SDN.Use"}}
    cluster.grant(dict(others, **{"/pool/fleet": {"VM.Audit"}}))
    refused(cluster, request("lp", 230, pool="fleet"), ["VM.Allocate on /pool/fleet (putting VM 1230 in pool fleet)",
                                                        "VM.Allocate on /vms/1230 (cloning the template)"])
    cluster.grant(dict(others, **{"/pool/fleet": DOCS_ROLE}))
    assert run_vm(cluster, request("lp", 230, pool="fleet")).changed


def test_a_server_that_does_not_say_what_the_token_holds_is_left_to_check_each_call(cluster):
    cluster.fail("privileges", NotFound("HTTP 501: Method 'GET /access/permissions' not implemented", status=501))
    outcome = run_vm(cluster, request("lp", 230))
    assert outcome.changed and "clone_vm" in cluster.write_names()
    assert any("the privileges of the API token could not be read" in w for w in outcome.warnings)


@pytest.mark.parametrize("lock, fragments", [
    ("backup", ["still locked (backup) after 1s", "A backup (vzdump) of it is running: let it finish",
                "never 'qm unlock' a VM whose backup runs"]),
    ("migrate", ["still locked (migrate)", "let the migration finish"]),
    ("suspended", ["still locked (suspended)", "'qm resume 1235'"]),
])
def test_a_lock_of_work_the_vm_is_doing_is_waited_for_and_never_advised_away(cluster, lock, fragments):
    fleet_vm(cluster, "busy", 235).lock = lock
    message = refused(cluster, request("busy", 235, memory=4096, timeout=1), fragments)
    assert "qm destroy" not in message


def test_slow_cpu_on_an_existing_vm_is_refused_before_any_change(cluster):
    fleet_vm(cluster, "holder", 221)
    refused(cluster, request("holder", 221, cpu="x86-64-v2-AES", memory=4096),
            ["refusing cpu x86-64-v2-AES", "libggml-cpu-sse42.so", "Set allow_slow_cpu: true"],
            error=PlanError, nothing_changed=False)


@pytest.mark.parametrize(
    "address, vmid_base, why",
    [
        ("10.77.0.228", 1000, "must be an IPv4 address with its prefix length"),
        ("10.77.0.0/24", 1000, "is the network address of 10.77.0.0/24"),
        ("10.77.0.99/24", 0, "vmid_base 0 + last octet 99 of 10.77.0.99/24 = 99 is below 100"),
    ],
)
def test_bad_address(cluster, address, vmid_base, why):
    refused(cluster, request("badaddr", 228, address=address, vmid_base=vmid_base), [why], error=PlanError,
            nothing_changed=False)


def test_a_vm_whose_ide2_holds_something_else_gets_no_cloud_init_drive(cluster):
    fleet_vm(cluster, "cdrom", 231, ide2="local:iso/debian.iso,media=cdrom")
    refused(cluster, request("cdrom", 231, memory=4096),
            ["the VM has no cloud-init drive and ide2", "local:iso/debian.iso", "free ide2"],
            error=PlanError, nothing_changed=False)


# ---- a new VM: check -> apply -> check -> apply -------------------------------------------------------------------


def test_present_clones_and_configures_a_stopped_vm(cluster):
    req = request("present", 201)
    predicted = run_vm(cluster, req, check_mode=True)
    assert predicted.changed is True
    assert cluster.writes == [] and 1201 not in cluster.vms
    assert predicted.result == {"vmid": 1201, "node": NODE, "name": "present", "cpu": "host",
                                "address": "10.77.0.201/24", "status": "stopped", "reboot_required": False,
                                "pending": []}

    applied = run_vm(cluster, req)
    assert applied.changed is True
    assert applied.diff == predicted.diff
    assert applied.result == predicted.result
    clone, update = cluster.writes
    assert clone.method == "clone_vm" and clone.args == {
        "node": NODE, "template_vmid": TEMPLATE_VMID, "newid": 1201, "name": "present", "timeout": 600, "full": True,
        "target": None, "storage": None, "pool": None}
    assert update.method == "update_config" and update.args["vmid"] == 1201
    assert update.args["params"] == {"cpu": "host", "ciuser": "debian", "sshkeys": encode_sshkeys(KEY + "\n"),
                                     "ipconfig0": "ip=10.77.0.201/24,gw=10.77.0.1", "nameserver": GATEWAY}
    # The update carries the digest of the clone as the runner read it, so a change made meanwhile is refused.
    (waited,) = [c for c in cluster.calls if c.method == "wait_unlocked"]
    assert waited.args == {"node": NODE, "vmid": 1201, "timeout": 600} and update.args["digest"]
    made = cluster.vms[1201]
    assert made.status == "stopped" and made.config["name"] == "present" and "template" not in made.config
    assert made.config["ide2"] == "local-lvm:vm-1201-cloudinit,media=cdrom"
    assert made.config["memory"] == "2048" and made.config["scsi0"] == TEMPLATE_CONFIG["scsi0"]

    assert settled(cluster, req).result == predicted.result


def test_diff_of_a_new_vm_names_every_key_the_clone_gets(cluster):
    outcome = run_vm(cluster, request("diffed", 216, memory=4096), check_mode=True)
    assert outcome.diff == {
        "before": {"state": "absent", "cpu": "kvm64", "memory": 2048, "ciuser": None, "sshkeys": None,
                   "ipconfig0": None, "nameserver": None},
        "after": {"state": "present", "cpu": "host", "memory": 4096, "ciuser": "debian", "sshkeys": KEY + "\n",
                  "ipconfig0": "ip=10.77.0.216/24,gw=10.77.0.1", "nameserver": GATEWAY},
    }


def test_started_clones_configures_and_starts(cluster):
    req = request("started", 202, state="started")
    predicted = run_vm(cluster, req, check_mode=True)
    assert cluster.writes == []
    assert predicted.result["status"] == "running"
    assert predicted.diff["before"]["status"] == "absent" and predicted.diff["after"]["status"] == "running"

    applied = run_vm(cluster, req)
    assert cluster.write_names() == ["clone_vm", "update_config", "start_vm"]
    assert applied.diff == predicted.diff and applied.result == predicted.result
    assert cluster.vms[1202].status == "running"
    final = settled(cluster, req)
    assert final.result["reboot_required"] is False and final.result["pending"] == []


def test_a_vm_made_from_nothing_gets_a_network_and_a_cloud_init_drive(cluster):
    req = request("bare", 232, clone=None, cores=2, memory=1024, pool="fleet")
    applied = run_vm(cluster, req)
    (create,) = cluster.writes
    assert create.method == "create_vm" and create.args["node"] == NODE and create.args["vmid"] == 1232
    assert create.args["params"] == {
        "name": "bare", "cpu": "host", "cores": 2, "memory": 1024, "ciuser": "debian",
        "sshkeys": encode_sshkeys(KEY + "\n"), "ipconfig0": "ip=10.77.0.232/24,gw=10.77.0.1", "nameserver": GATEWAY,
        "ide2": "local-lvm:cloudinit", "net0": "virtio,bridge=vmbr0", "pool": "fleet"}
    assert applied.result["node"] == NODE and applied.result["status"] == "stopped"
    settled(cluster, req)


def test_a_clone_to_another_node_passes_target_storage_and_pool():
    cluster = FakeProxmoxClient(nodes=("pve", "pve2"))
    cluster.add_template()
    req = request("far", 233, node="pve2", full_clone=False, storage="fast", pool="fleet")
    outcome = run_vm(cluster, req)
    clone = cluster.writes[0]
    assert (clone.args["node"], clone.args["target"], clone.args["full"]) == ("pve", "pve2", False)
    assert (clone.args["storage"], clone.args["pool"]) == ("fast", "fleet")
    assert cluster.writes[1].args["node"] == "pve2"
    assert cluster.vms[1233].node == "pve2" and outcome.result["node"] == "pve2"
    assert cluster.vms[1233].config["ide2"] == "fast:vm-1233-cloudinit,media=cdrom"


# ---- the VMID: address's last octet + vmid_base, or an explicit vmid ----------------------------------------------


@pytest.mark.parametrize(
    "extra, vmid",
    [({}, 1105), ({"vmid_base": 2000}, 2105), ({"vmid_base": 0}, 105), ({"vmid": 3210}, 3210)],
)
def test_vmid_is_the_last_octet_plus_vmid_base_unless_given(cluster, extra, vmid):
    outcome = run_vm(cluster, request("node05", 105, **extra))
    assert outcome.result["vmid"] == vmid
    assert cluster.writes[0].args["newid"] == vmid
    assert sorted(cluster.vms) == [vmid, TEMPLATE_VMID]


def test_next_free_id_inside_the_fleet_block_or_equal_to_the_vmid_is_warned_about(cluster):
    cluster.next_id = 150
    warnings = run_vm(cluster, request("base0", 214, vmid_base=0), check_mode=True).warnings
    assert len(warnings) == 1 and "next free VMID is 150, inside this fleet's block 0-255" in warnings[0]
    warnings = run_vm(cluster, request("explicit", 214, vmid=150), check_mode=True).warnings
    assert warnings == ["VMID 150 is the cluster's next free id: a VM created elsewhere without an explicit id "
                        "would take it"]
    assert run_vm(cluster, request("quiet", 215), check_mode=True).warnings == []


def test_slow_cpu_is_allowed_when_asked_and_warned_about(cluster):
    outcome = run_vm(cluster, request("slowcpu", 209, cpu="kvm64", allow_slow_cpu=True))
    assert outcome.result["cpu"] == "kvm64"
    (warning,) = outcome.warnings
    assert "libggml-cpu-x64.so" in warning and "6.7x" in warning and "18.9x" in warning
    # The template has no cpu key, which PVE runs as kvm64: nothing to write, and nothing was written.
    assert "cpu" not in cluster.writes[1].args["params"] and "cpu" not in cluster.vms[1209].config


# ---- existing VMs ---------------------------------------------------------------------------------------------------


def test_half_made_vm_from_an_interrupted_run_is_finished(cluster):
    cluster.add_vm(1208, "half", config=TEMPLATE_CONFIG)  # a bare clone, as an interrupted run leaves it
    req = request("half", 208, state="started")
    outcome = run_vm(cluster, req)
    assert outcome.changed is True and "state" not in outcome.diff["after"]
    assert set(outcome.diff["after"]) == {"cpu", "ciuser", "sshkeys", "ipconfig0", "nameserver", "status"}
    assert cluster.write_names() == ["update_config", "start_vm"]
    assert cluster.vms[1208].config["ipconfig0"] == "ip=10.77.0.208/24,gw=10.77.0.1"
    assert cluster.vms[1208].status == "running"
    settled(cluster, req)


def test_a_lock_that_clears_while_waited_for_is_no_refusal(cluster):
    vm = fleet_vm(cluster, "busy", 234)
    vm.lock, vm.unlock_after = "backup", 1
    outcome = run_vm(cluster, request("busy", 234, memory=4096))
    assert outcome.diff == {"before": {"memory": 2048}, "after": {"memory": 4096}}
    assert cluster.write_names() == ["update_config"] and vm.config["memory"] == 4096 and vm.lock is None


def test_stopped_shuts_a_running_vm_down(cluster):
    fleet_vm(cluster, "stopped", 203, status="running")
    req = request("stopped", 203, state="stopped", shutdown_timeout=45)
    predicted = run_vm(cluster, req, check_mode=True)
    assert cluster.writes == [] and cluster.vms[1203].status == "running"
    applied = run_vm(cluster, req)
    assert applied.diff == predicted.diff == {"before": {"status": "running"}, "after": {"status": "stopped"}}
    (shutdown,) = cluster.writes
    assert shutdown == ("shutdown_vm", {"node": NODE, "vmid": 1203, "timeout": 600, "grace": 45})
    assert cluster.vms[1203].status == "stopped" and applied.result["status"] == "stopped"
    settled(cluster, req)


def test_changes_to_a_stopped_vm_need_no_reboot_and_key_order_is_no_change(cluster):
    fleet_vm(cluster, "cold", 207, cores=1)
    req = request("cold", 207, cores=2, sshkeys=[KEY, EXTRA_KEY])
    outcome = run_vm(cluster, req)
    assert outcome.diff == {"before": {"cores": 1, "sshkeys": KEY + "\n"},
                            "after": {"cores": 2, "sshkeys": KEY + "\n" + EXTRA_KEY + "\n"}}
    assert outcome.result["reboot_required"] is False and outcome.warnings == []
    assert cluster.vms[1207].config["cores"] == 2
    reordered = request("cold", 207, cores=2, sshkeys=EXTRA_KEY.replace("second@fleet", "") + "\n" + KEY + "\n")
    settled(cluster, reordered)


def test_changes_to_a_running_vm_are_reported_until_a_reboot_applies_them(cluster):
    fleet_vm(cluster, "reboot", 206, status="running", memory="1024")
    req = request("reboot", 206, state="started", memory=1536)

    predicted = run_vm(cluster, req, check_mode=True)
    assert cluster.writes == []
    changed = run_vm(cluster, req)
    for outcome in (predicted, changed):
        assert outcome.changed is True and outcome.diff == {"before": {"memory": 1024}, "after": {"memory": 1536}}
        assert outcome.result["reboot_required"] is True and outcome.result["pending"] == ["memory"]
        (warning,) = outcome.warnings
        assert "VM reboot (1206)" in warning and "next boot: memory" in warning and "reboot_if_needed" in warning
    assert cluster.write_names() == ["update_config"]
    assert cluster.vms[1206].pending == {"memory": 1536}

    # The change is in the config now; what is left is the reboot, and it keeps being reported.
    del cluster.calls[:]
    again = run_vm(cluster, req)
    assert again.changed is False and again.result["reboot_required"] is True and again.result["pending"] == ["memory"]
    assert cluster.writes == []

    rebooted = run_vm(cluster, request("reboot", 206, state="started", memory=1536, reboot_if_needed=True))
    assert rebooted.diff == {"before": {"reboot": {"pending": ["memory"]}}, "after": {"reboot": "rebooted"}}
    assert cluster.write_names() == ["reboot_vm"] and cluster.vms[1206].config["memory"] == 1536
    final = settled(cluster, request("reboot", 206, state="started", memory=1536, reboot_if_needed=True))
    assert final.result["reboot_required"] is False and final.result["pending"] == []
    assert cluster.vms[1206].status == "running"


# ---- state absent -------------------------------------------------------------------------------------------------


def test_absent_stops_and_removes_only_the_named_vm(cluster):
    fleet_vm(cluster, "absent", 204, status="running")
    fleet_vm(cluster, "neighbour", 205, status="running")
    req = VMRequest(name="absent", address="10.77.0.204/24", state="absent")

    predicted = run_vm(cluster, req, check_mode=True)
    assert cluster.writes == [] and 1204 in cluster.vms
    applied = run_vm(cluster, req)
    for outcome in (predicted, applied):
        assert outcome.changed is True
        assert outcome.diff == {"before": {"state": "present"}, "after": {"state": "absent"}}
        assert outcome.result == {"vmid": 1204, "node": NODE, "name": "absent", "cpu": "host",
                                  "address": "10.77.0.204/24", "status": "absent"}
    assert [(c.method, c.args["vmid"]) for c in cluster.writes] == [("stop_vm", 1204), ("delete_vm", 1204)]
    assert sorted(cluster.vms) == [1205, TEMPLATE_VMID] and cluster.vms[1205].status == "running"
    final = settled(cluster, req)
    assert final.result == {"vmid": None, "node": None, "name": "absent", "cpu": None, "address": None,
                            "status": "absent"}


def test_absent_deletes_a_stopped_vm_without_a_stop_and_never_a_guest_that_only_holds_the_vmid(cluster):
    fleet_vm(cluster, "cold", 235)
    fleet_vm(cluster, "other", 240)
    run_vm(cluster, VMRequest(name="cold", state="absent"))
    assert [(c.method, c.args["vmid"]) for c in cluster.writes] == [("delete_vm", 1235)]
    assert 1235 not in cluster.vms

    # No VM is named 'gone': VMID 1240, which its address derives, is another VM's and stays.
    del cluster.calls[:]
    outcome = run_vm(cluster, VMRequest(name="gone", address="10.77.0.240/24", state="absent"))
    assert outcome.changed is False and outcome.result["vmid"] is None
    assert cluster.writes == [] and cluster.vms[1240].config["name"] == "other"


# ---- errors of the client ------------------------------------------------------------------------------------------


def test_failed_start_task_is_raised_with_its_log_and_the_next_run_finishes(cluster):
    fleet_vm(cluster, "taskfail", 212)
    injected = task_failed("qmstart", 1212, "start failed: injected by the test")
    cluster.fail("start_vm", injected, vmid=1212)
    req = request("taskfail", 212, state="started")
    with pytest.raises(TaskFailed) as caught:
        run_vm(cluster, req)
    assert caught.value is injected
    message = str(caught.value)
    assert "task qmstart 1212 on node pve failed: start failed: injected by the test" in message
    assert "task log" in message
    assert caught.value.upid.startswith("UPID:pve:") and caught.value.log_tail[-1].startswith("TASK ERROR:")
    assert cluster.write_names() == ["start_vm"] and cluster.vms[1212].status == "stopped"

    del cluster.calls[:]
    finished = run_vm(cluster, req)
    assert finished.diff == {"before": {"status": "stopped"}, "after": {"status": "running"}}
    assert cluster.write_names() == ["start_vm"] and cluster.vms[1212].status == "running"


def test_failed_clone_leaves_no_vm_and_the_next_run_makes_it(cluster):
    cluster.fail("clone_vm", task_failed("qmclone", TEMPLATE_VMID, "clone failed: out of space"), vmid=1236)
    req = request("noclone", 236)
    with pytest.raises(TaskFailed, match="qmclone 9000 on node pve failed: clone failed: out of space"):
        run_vm(cluster, req)
    assert cluster.write_names() == ["clone_vm"] and 1236 not in cluster.vms
    assert run_vm(cluster, req).changed is True and cluster.vms[1236].config["name"] == "noclone"


def test_a_config_changed_between_read_and_write_is_refused_by_its_digest(cluster, monkeypatch):
    vm = fleet_vm(cluster, "raced", 237)
    read_status = cluster.vm_status

    def status_after_someone_edited_the_vm(node, vmid):
        cluster.vms[vmid].config["description"] = "edited by hand"
        return read_status(node, vmid)

    monkeypatch.setattr(cluster, "vm_status", status_after_someone_edited_the_vm)
    with pytest.raises(ConfigChanged, match="checksum mismatch"):
        run_vm(cluster, request("raced", 237, memory=4096))
    assert cluster.write_names() == ["update_config"] and vm.config["memory"] == "2048"


def test_the_fake_has_every_client_method_the_runner_calls_with_the_same_signature():
    # the runner, its checks and its reads for pve_vm_info
    source = "".join(inspect.getsource(part) for part in (pve_vm_runner, _vm_runner_checks, _vm_info))
    called = set(re.findall(r"client\.(\w+)\(", source))
    assert {"guests", "vm_config", "clone_vm", "update_config", "start_vm", "delete_vm", "find_vms"} <= called
    for method in sorted(called):
        real = inspect.signature(getattr(ProxmoxClient, method))
        assert inspect.signature(getattr(FakeProxmoxClient, method)) == real, method


# ---- vm_info --------------------------------------------------------------------------------------------------------


def test_vm_info_reads_vms_only_with_effective_cpu_and_decoded_keys(cluster):
    fleet_vm(cluster, "info", 211, status="running")
    cluster.add_container(1300, "info")
    (entry,) = vm_info(cluster, name="info")
    assert (entry["vmid"], entry["node"], entry["status"], entry["cpu"], entry["address"]) == (
        1211, NODE, "running", "host", "10.77.0.211/24")
    assert entry["sshkeys"] == [KEY] and entry["gateway"] == GATEWAY and entry["memory"] == 2048
    (template,) = vm_info(cluster, vmid=TEMPLATE_VMID, include_config=True)
    assert template["template"] is True and template["cpu"] == "kvm64" and template["cpu_explicit"] is False
    assert "digest" in template["config"]
