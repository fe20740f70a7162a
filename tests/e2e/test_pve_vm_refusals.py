"""Every refusal of llmgw.fleet.pve_vm on the lab: it fails, names what is involved, and changes nothing.

"Nothing" is checked on the whole cluster: the guest list and every VM's config (digest included) are the same
before and after the refused run, in check mode and for real.
"""

import pytest
from pve_vm_e2e import PREFIX, assert_ok, lab_session, vm_args


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    for session in lab_session():
        # Two fleet VMs the refusals run into: 'holder' (10.77.0.221, VMID 1221) and a pair sharing one name.
        tmp = tmp_path_factory.mktemp("setup")
        assert_ok(session.run(tmp, vm_args(session, "holder", 221, state="present")))
        session.clone_bare(1222, PREFIX + "twin")
        session.clone_bare(1223, PREFIX + "twin")
        yield session


def refused(lab, tmp_path, args, *fragments):
    """Run ``args`` in check mode and for real; both must fail with every fragment and leave all as it was."""
    before = lab.snapshot()
    for check in (True, False):
        result = lab.run(tmp_path, args, check=check)
        assert result.get("failed"), "not refused (check=%s): %s" % (check, result)
        for fragment in fragments:
            assert fragment in result["msg"], (fragment, result["msg"])
        assert "Nothing was changed" in result["msg"]
        assert lab.snapshot() == before, "a refused run (check=%s) changed the cluster" % check
    return result


def test_vmid_used_under_another_name(lab, tmp_path):
    args = vm_args(lab, "intruder", 224, vmid=1221)
    refused(lab, tmp_path, args, "VMID 1221", repr(PREFIX + "holder"), repr(PREFIX + "intruder"))


def test_vmid_derived_from_the_address_used_under_another_name(lab, tmp_path):
    args = vm_args(lab, "intruder", 221, vmid_base=1000)
    args["address"] = "10.78.0.221/24"  # another network, same last octet: same VMID
    args["gateway"] = "10.78.0.1"
    refused(lab, tmp_path, args, "VMID 1221", "holder", "intruder")


def test_name_exists_under_another_vmid(lab, tmp_path):
    args = vm_args(lab, "holder", 225)
    refused(lab, tmp_path, args, "VMID 1221", "VMID 1225", "vmid: 1221")


def test_name_matching_several_vms(lab, tmp_path):
    args = vm_args(lab, "twin", 222)
    refused(lab, tmp_path, args, "matches 2 VMs", "VMID 1222", "VMID 1223")


def test_name_matching_several_vms_is_refused_for_absent_too(lab, tmp_path):
    refused(lab, tmp_path, {"name": PREFIX + "twin", "state": "absent"}, "matches 2 VMs")


def test_address_used_by_another_vm(lab, tmp_path):
    args = vm_args(lab, "newcomer", 221, vmid_base=2000)
    refused(lab, tmp_path, args, "10.77.0.221", "already used by", repr(PREFIX + "holder"))


def test_name_of_the_template(lab, tmp_path):
    args = vm_args(lab, "x", 226)
    args["name"] = lab.template_name
    refused(lab, tmp_path, args, "template", str(lab.template_vmid))


def test_missing_template(lab, tmp_path):
    refused(lab, tmp_path, vm_args(lab, "orphan", 227, clone="no-such-template"), "no-such-template")


def test_unknown_vm_without_address_or_vmid(lab, tmp_path):
    refused(lab, tmp_path, {"name": PREFIX + "nowhere", "clone": lab.template_name}, "VMID is unknown")


@pytest.mark.parametrize(
    "address, why",
    [("10.77.0.228", "prefix"), ("10.77.0.0/24", "network address"), ("10.77.0.99/24", "below 100")],
)
def test_bad_address(lab, tmp_path, address, why):
    before = lab.snapshot()
    args = vm_args(lab, "badaddr", 228, address=address, vmid_base=0 if why == "below 100" else 1000)
    result = lab.run(tmp_path, args)
    assert result.get("failed") and why in result["msg"]
    assert lab.snapshot() == before


def test_slow_cpu_on_an_existing_vm_is_refused_before_any_change(lab, tmp_path):
    args = vm_args(lab, "holder", 221, cpu="x86-64-v2-AES", memory=2048)
    before = lab.snapshot()
    result = lab.run(tmp_path, args)
    assert result.get("failed") and "libggml-cpu-sse42.so" in result["msg"] and "allow_slow_cpu" in result["msg"]
    assert lab.snapshot() == before


def test_half_made_vm_still_locked_by_its_clone_is_reported_by_name(lab, tmp_path):
    lab.clone_bare(1229, PREFIX + "locked")
    lab.inject({"lock": {"vmid": 1229, "lock": "clone"}})
    try:
        args = vm_args(lab, "locked", 229, state="started", timeout=1)
        refused(lab, tmp_path, args, repr(PREFIX + "locked"), "VMID 1229", "locked (clone)", "interrupted run",
                "qm unlock 1229")
    finally:
        lab.inject({"lock": {"vmid": 1229, "lock": None}})


def test_a_vm_a_backup_holds_is_waited_for_and_never_advised_to_unlock(lab, tmp_path):
    """qemu-server's vzdump sets `lock: backup` for the backup's length: the run waits for it, and past its timeout
    says to let the backup finish, never to unlock or destroy the VM (the advice for a half-made clone)."""
    lab.inject({"lock": {"vmid": 1221, "lock": "backup"}})
    try:
        args = vm_args(lab, "holder", 221, state="present", memory=3072, timeout=1)
        result = refused(lab, tmp_path, args, repr(PREFIX + "holder"), "locked (backup)",
                         "A backup (vzdump) of it is running: let it finish")
        assert "qm destroy" not in result["msg"]
    finally:
        lab.inject({"lock": {"vmid": 1221, "lock": None}})
