"""Cloning the lab's cloud-init template, and clones of clones."""

import pytest
from proxmoxer import ResourceException


def test_linked_clone_of_the_template(node, conn, vms, tasks):
    template = node.qemu(conn["template_vmid"]).config.get()
    assert (template["template"], template["name"]) == (1, conn["template_name"])
    assert template["ide2"].endswith("-cloudinit,media=cdrom")
    assert (template["agent"], template["serial0"], template["vga"]) == ("1", "socket", "serial0")
    assert template["net0"].endswith(",bridge=vmbr0")
    vmid = vms.clone(name="linked")
    config = node.qemu(vmid).config.get()
    assert "template" not in config and "cpu" not in config and "lock" not in config
    assert config["name"] == "linked"
    for key in ("agent", "serial0", "vga", "scsihw", "cores", "memory", "ostype"):
        assert config[key] == template[key], key
    assert config["ide2"] == "local-lvm:vm-%d-cloudinit,media=cdrom" % vmid
    assert config["scsi0"] == "local-lvm:vm-%d-disk-0,size=3G" % vmid
    assert config["net0"] != template["net0"] and config["net0"].endswith(",bridge=vmbr0")  # a new MAC
    assert config["smbios1"] != template["smbios1"]


def test_the_clone_task_logs_what_it_did(api, node, conn, vms, tasks):
    newid = vms.track(vms.free_id())
    upid = node.qemu(conn["template_vmid"]).clone.post(newid=newid, name="logged")
    tasks.ok(upid)
    lines = [entry["t"] for entry in node.tasks(upid).log.get()]
    assert lines[0] == "create linked clone of VM %d with ID %d" % (conn["template_vmid"], newid)
    assert lines[-1] == "TASK OK"


def test_full_clone_and_clone_of_a_clone(node, vms):
    first = vms.clone(name="first", full=1)
    second = vms.clone(source=first, name="second")  # a normal VM clones full by default
    assert node.qemu(second).config.get()["scsi0"] == "local-lvm:vm-%d-disk-0,size=3G" % second


def test_a_clone_without_name_is_copy_of_vm(node, conn, vms):
    vmid = vms.clone()
    assert node.qemu(vmid).config.get()["name"] == "Copy-of-VM-%s" % conn["template_name"]


def test_linked_clone_of_a_normal_vm_is_refused(node, vms):
    source = vms.clone(name="plain", full=1)
    newid = vms.free_id()
    with pytest.raises(ResourceException) as caught:
        node.qemu(source).clone.post(newid=newid, full=0)
    assert caught.value.content == "Linked clone feature is not supported for 'local-lvm:vm-%d-disk-0' (scsi0)" % source


def test_clone_onto_an_existing_vmid_is_refused(node, conn):
    with pytest.raises(ResourceException) as caught:
        node.qemu(conn["template_vmid"]).clone.post(newid=conn["template_vmid"])
    assert caught.value.content == "unable to create VM %d: config file already exists" % conn["template_vmid"]


def test_clone_of_a_missing_vm_is_refused(node, conn, vms):
    missing, newid = vms.free_id(), vms.free_id() + 1
    with pytest.raises(ResourceException) as caught:
        node.qemu(missing).clone.post(newid=newid)
    assert caught.value.content == "unable to find configuration file for VM %d on node '%s'" % (
        missing, conn["pve_node"])


def test_clone_to_another_node_is_refused(node, conn, vms):
    with pytest.raises(ResourceException) as caught:
        node.qemu(conn["template_vmid"]).clone.post(newid=vms.free_id(), target="elsewhere")
    assert caught.value.content == "no such cluster node 'elsewhere'"


def test_clone_name_must_be_a_dns_name(node, conn, vms):
    with pytest.raises(ResourceException) as caught:
        node.qemu(conn["template_vmid"]).clone.post(newid=vms.free_id(), name="bad name")
    assert caught.value.status_code == 400
    assert caught.value.errors == {"name": "invalid format - value does not look like a valid DNS name\n"}


def test_a_vm_converted_to_template_clones_linked(node, vms, tasks):
    source = vms.create(name="base", scsi0="local-lvm:2")
    tasks.ok(node.qemu(source).template.post())
    config = node.qemu(source).config.get()
    assert (config["template"], config["scsi0"]) == (1, "local-lvm:base-%d-disk-0,size=2G" % source)
    with pytest.raises(ResourceException) as caught:
        node.qemu(source).template.post()
    assert caught.value.content == "you can't convert a template to a template"
    clone = vms.clone(source=source, name="fromtemplate", full=0)  # linked: only a template allows it
    assert node.qemu(clone).config.get()["scsi0"] == "local-lvm:vm-%d-disk-0,size=2G" % clone


def test_a_disk_grows_and_does_not_shrink(node, vms, tasks):
    vm = node.qemu(vms.create(name="growing", scsi0="local-lvm:2"))
    tasks.ok(vm.resize.put(disk="scsi0", size="+1G"))
    assert vm.config.get()["scsi0"].endswith(",size=3G")
    tasks.ok(vm.resize.put(disk="scsi0", size="4G"))
    assert vm.config.get()["scsi0"].endswith(",size=4G")
    assert tasks.wait(vm.resize.put(disk="scsi0", size="1G"))["exitstatus"] == "shrinking disks is not supported"
