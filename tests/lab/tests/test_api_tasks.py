"""Tasks: UPIDs in PVE's format, status running then stopped, exit status, log, the task list."""

import re

import pytest
from proxmoxer import ResourceException
from proxmoxer.tools import Tasks


def test_upid_has_pve_format_with_trailing_colon(node, conn, vms, tasks):
    newid = vms.track(vms.free_id())
    upid = node.qemu(conn["template_vmid"]).clone.post(newid=newid, name="upid")
    assert re.match(r"^UPID:pve:[0-9A-F]{8}:[0-9A-F]{8,9}:[0-9A-F]{8}:qmclone:%d:root@pam!llmgw:$"
                    % conn["template_vmid"], upid)
    decoded = Tasks.decode_upid(upid)
    assert (decoded["node"], decoded["type"], decoded["id"], decoded["user"]) == (
        conn["pve_node"], "qmclone", str(conn["template_vmid"]), "root@pam")
    status = tasks.ok(upid)
    assert (status["upid"], status["type"], status["status"]) == (upid, "qmclone", "stopped")


def test_a_task_is_running_before_it_is_stopped(node, vms, faults, tasks):
    faults.set(task_delay=2)
    vmid = vms.track(vms.free_id())
    upid = node.qemu.create(vmid=vmid, name="slow")
    running = node.tasks(upid).status.get()
    assert running["status"] == "running" and "exitstatus" not in running
    assert tasks.ok(upid)["status"] == "stopped"


def test_the_log_ends_with_the_outcome(node, vms, tasks):
    vmid = vms.create(name="logs")
    upid = node.qemu(vmid).config.post(description="logged")
    tasks.ok(upid)
    log = node.tasks(upid).log.get()
    assert [entry["n"] for entry in log] == list(range(1, len(log) + 1))
    assert log[-1]["t"] == "TASK OK"
    assert Tasks.decode_log(log).endswith("TASK OK")


def test_a_failed_task_exits_with_the_error_text(node, conn, tasks):
    upid = node.qemu(conn["template_vmid"]).status.start.post()
    status = tasks.wait(upid)
    assert status["exitstatus"] == "you can't start a vm if it's a template"
    assert node.tasks(upid).log.get()[-1]["t"] == "TASK ERROR: you can't start a vm if it's a template"


def test_finished_tasks_are_listed(node, vms, tasks):
    vmid = vms.create(name="listed-task")
    upid = node.qemu(vmid).config.post(description="x")
    tasks.ok(upid)
    entry = next(t for t in node.tasks.get(vmid=vmid) if t["upid"] == upid)
    assert (entry["type"], entry["status"], entry["id"]) == ("qmconfig", "OK", str(vmid))
    assert entry["endtime"] >= entry["starttime"]


def test_a_malformed_upid_is_500(node):
    with pytest.raises(ResourceException) as caught:
        node.tasks("UPID:garbage").status.get()
    assert caught.value.content == "unable to parse worker upid 'UPID:garbage'"
