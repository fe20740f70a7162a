"""VM locks: a clone's new VM is locked while the clone runs; a lock refuses changes, start and destroy."""

import pytest
from proxmoxer import ResourceException
from test_api_clone_locks import wait_for_config


def test_the_new_vm_is_locked_while_the_clone_runs(api, node, conn, vms, faults, tasks):
    faults.set(task_delay=3)
    newid = vms.track(vms.free_id())
    upid = node.qemu(conn["template_vmid"]).clone.post(newid=newid, name="locked")
    # the worker writes the temporary config once it holds its locks (test_api_clone_locks.py)
    assert wait_for_config(node, newid)["lock"] == "clone"
    assert node.qemu(newid).status.current.get()["lock"] == "clone"
    with pytest.raises(ResourceException) as caught:
        node.qemu(newid).config.put(description="too early")
    assert (caught.value.status_code, caught.value.content) == (500, "VM is locked (clone)")
    with pytest.raises(ResourceException) as caught:
        node.qemu(newid).clone.post(newid=vms.free_id())
    assert caught.value.content == "VM is locked (clone)"
    faults.set(task_delay=0)
    tasks.ok(upid)
    assert "lock" not in node.qemu(newid).config.get()
    node.qemu(newid).config.put(description="now")


def test_a_locked_vm_refuses_changes_start_and_destroy(node, ticket_api, conn, vms, faults, tasks):
    vmid = vms.create(name="backup-locked", memory=128)
    vm = node.qemu(vmid)
    faults.lock(vmid, "backup")
    assert vm.config.get()["lock"] == "backup"
    with pytest.raises(ResourceException) as caught:
        vm.config.put(description="x")
    assert caught.value.content == "VM is locked (backup)"
    assert tasks.wait(vm.status.start.post())["exitstatus"] == "VM is locked (backup)"
    assert tasks.wait(vm.delete())["exitstatus"] == "VM is locked (backup)"
    with pytest.raises(ResourceException) as caught:
        vm.config.put(description="a token may not skip the lock", skiplock=1)
    assert caught.value.errors == {"skiplock": "Only root may use this option."}
    ticket_api.nodes(conn["pve_node"]).qemu(vmid).config.put(description="root@pam may", skiplock=1)
    faults.lock(vmid, None)
    vm.config.put(description="unlocked")
    assert vm.config.get()["description"] == "unlocked"
