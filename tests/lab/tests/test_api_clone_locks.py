"""Concurrent clones, locked as qemu-server locks them (src/PVE/API2/Qemu.pm, clone_vm, read at qemu-server
e6352be): the worker takes the source's config lock shared when the source is not running
(`lock_config_shared($vmid, 1, ...)`) and exclusive when it is, then the new VMID's exclusive
(`lock_config_full($newid, 1, $clonefn)`), both with a 1 s timeout and held for the whole clone. When a timeout runs
out, pve-common's PVE::Tools::lock_file_full (pve-common f665029) dies "can't lock file '<path>' - got timeout" and
the task ends with that text, nothing created. The load_and_check that runs before forking and again inside the
locks refuses a VMID whose (temporary) config exists: "unable to create VM N: config file already exists"."""

import time

import pytest
from proxmoxer import ResourceException


def free_ids(vms, count):
    first = vms.free_id()
    return [vms.track(first + offset) for offset in range(count)]


def wait_for_config(node, vmid, seconds=5.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            return node.qemu(vmid).config.get()
        except ResourceException:
            time.sleep(0.05)
    raise AssertionError("VM %d has no config after %ss" % (vmid, seconds))


def test_clones_of_one_stopped_template_hold_its_lock_shared_and_run_side_by_side(node, conn, vms, faults, tasks):
    faults.set(task_delay=2)  # each clone's disk copy takes 2 s, its locks held
    ids = free_ids(vms, 8)
    started = time.monotonic()
    upids = [node.qemu(conn["template_vmid"]).clone.post(newid=newid, name="side-%d" % newid) for newid in ids]
    statuses = [tasks.wait(upid) for upid in upids]
    elapsed = time.monotonic() - started
    assert [s["exitstatus"] for s in statuses] == ["OK"] * 8
    assert elapsed < 8.0, "8 clones of 2 s took %.1f s: they did not share the template's lock" % elapsed
    assert {vm["name"] for vm in node.qemu.get() if vm["vmid"] in ids} == {"side-%d" % i for i in ids}


def test_a_clone_gives_up_after_1_s_on_a_source_lock_held_exclusively(node, conn, vms, faults, tasks):
    template = conn["template_vmid"]
    newid = vms.track(vms.free_id())
    faults.set(hold_config_lock={"vmid": template, "seconds": 4})
    started = time.monotonic()
    status = tasks.wait(node.qemu(template).clone.post(newid=newid, name="too-soon"))
    elapsed = time.monotonic() - started
    assert status["exitstatus"] == "can't lock file '/var/lock/qemu-server/lock-%d.conf' - got timeout" % template
    assert 1.0 <= elapsed < 3.5
    assert newid not in {vm["vmid"] for vm in node.qemu.get()}  # refused on the lock: nothing made
    time.sleep(max(0.0, 4.5 - (time.monotonic() - started)))
    tasks.ok(node.qemu(template).clone.post(newid=newid, name="in-time"))  # the same clone once the lock is free


def test_a_second_clone_to_a_vmid_being_cloned_is_refused_and_the_first_survives(node, conn, vms, faults, tasks):
    faults.set(task_delay=3)
    newid = vms.track(vms.free_id())
    first = node.qemu(conn["template_vmid"]).clone.post(newid=newid, name="first")
    assert wait_for_config(node, newid)["lock"] == "clone"
    with pytest.raises(ResourceException) as caught:
        node.qemu(conn["template_vmid"]).clone.post(newid=newid, name="second")
    assert caught.value.content == "unable to create VM %d: config file already exists" % newid
    assert tasks.ok(first)
    assert node.qemu(newid).config.get()["name"] == "first"
