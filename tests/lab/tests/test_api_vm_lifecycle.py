"""Create, start/stop through tasks, status, delete."""

import re

import pytest
from proxmoxer import ResourceException
from proxmoxer.tools import Tasks

UPID_RE = r"^UPID:%s:[0-9A-F]{8}:[0-9A-F]{8,9}:[0-9A-F]{8}:%s:%s:root@pam!llmgw:$"


def test_create_allocates_disks_and_macs_and_sets_no_cpu(node, conn, vms, tasks):
    vmid = vms.track(vms.free_id())
    upid = node.qemu.create(vmid=vmid, name="fresh", cores=2, memory=256, net0="virtio,bridge=vmbr0",
                            scsihw="virtio-scsi-pci", scsi0="local-lvm:4", ide2="local-lvm:cloudinit")
    assert re.match(UPID_RE % (conn["pve_node"], "qmcreate", vmid), upid)
    tasks.ok(upid)
    config = node.qemu(vmid).config.get()
    assert "cpu" not in config  # no cpu key: PVE runs it as kvm64
    assert (config["name"], config["cores"], config["memory"]) == ("fresh", 2, "256")
    assert re.match(r"^virtio=BC:24:11(:[0-9A-F]{2}){3},bridge=vmbr0$", config["net0"])
    assert config["scsi0"] == "local-lvm:vm-%d-disk-0,size=4G" % vmid
    assert config["ide2"] == "local-lvm:vm-%d-cloudinit,media=cdrom" % vmid
    assert config["boot"] == "order=scsi0;net0"
    assert re.match(r"^uuid=[0-9a-f-]{36}$", config["smbios1"])


def test_a_vm_created_from_nothing_is_listed_stopped(api, vms):
    vmid = vms.create(name="listed", memory=128)
    entry = next(e for e in api.cluster.resources.get(type="vm") if e["vmid"] == vmid)
    assert (entry["id"], entry["name"], entry["status"], entry["template"]) == ("qemu/%d" % vmid, "listed",
                                                                                "stopped", 0)


def test_start_and_stop_through_tasks(api, node, vms, tasks):
    vmid = vms.create(name="power", memory=128)
    vm = node.qemu(vmid)
    start = vm.status.start.post()
    assert Tasks.decode_upid(start)["type"] == "qmstart"
    tasks.ok(start)
    current = vm.status.current.get()
    assert (current["status"], current["qmpstatus"]) == ("running", "running")
    assert tasks.wait(vm.status.start.post())["exitstatus"] == "VM %d already running" % vmid
    tasks.ok(vm.status.stop.post())
    assert vm.status.current.get()["status"] == "stopped"
    tasks.ok(vm.status.stop.post())  # stopping a stopped VM is no error
    tasks.ok(vm.status.start.post())
    tasks.ok(vm.status.shutdown.post(timeout=5, forceStop=1))
    assert vm.status.current.get()["status"] == "stopped"


def test_reboot_of_a_stopped_vm_is_500(node, vms):
    vmid = vms.create(name="asleep", memory=128)
    with pytest.raises(ResourceException) as caught:
        node.qemu(vmid).status.reboot.post()
    assert (caught.value.status_code, caught.value.content) == (500, "VM %d not running" % vmid)


def test_a_template_does_not_start(node, conn, tasks):
    status = tasks.wait(node.qemu(conn["template_vmid"]).status.start.post())
    assert status["exitstatus"] == "you can't start a vm if it's a template"


def test_a_running_vm_is_not_destroyed(node, vms, tasks):
    vmid = vms.create(name="busy", memory=128)
    tasks.ok(node.qemu(vmid).status.start.post())
    with pytest.raises(ResourceException) as caught:
        node.qemu(vmid).delete()
    assert caught.value.content == "VM %d is running - destroy failed" % vmid


def test_delete_with_purge_removes_the_vm(api, node, conn, vms, tasks):
    vmid = vms.create(name="doomed", scsi0="local-lvm:1")
    upid = node.qemu(vmid).delete(purge=1, **{"destroy-unreferenced-disks": 1})
    assert Tasks.decode_upid(upid)["type"] == "qmdestroy"
    tasks.ok(upid)
    assert vmid not in {e["vmid"] for e in api.cluster.resources.get(type="vm")}
    with pytest.raises(ResourceException) as caught:
        node.qemu(vmid).config.get()
    assert caught.value.content == "Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist" % (
        conn["pve_node"], vmid)
