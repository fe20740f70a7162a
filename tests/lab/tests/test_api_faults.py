"""Fault injection through /lab/faults: failing tasks, 5xx answers, slow answers, reset connections, slow tasks."""

import time

import pytest
import requests
from proxmoxer import ResourceException


def test_lab_info_says_which_backend_runs(conn, lab):
    url = "https://%s:%d/lab/info" % (conn["api_host"], conn["api_port"])
    info = requests.get(url, verify=conn["ca_cert"], timeout=30).json()["data"]
    assert info["backend"] == lab.backend and info["node"] == conn["pve_node"]


def test_the_next_task_fails_with_the_given_text(node, vms, faults, tasks):
    vmid = vms.track(vms.free_id())
    faults.set(fail_next_task={"message": "storage on fire", "type": "qmcreate", "vmid": vmid})
    status = tasks.wait(node.qemu.create(vmid=vmid, name="burnt"))
    assert status["exitstatus"] == "unable to create VM %d - storage on fire" % vmid
    with pytest.raises(ResourceException):
        node.qemu(vmid).config.get()  # a failed create leaves no VM behind
    assert "storage on fire" not in [f["message"] for f in faults.state()["task_failures"]]
    tasks.ok(node.qemu.create(vmid=vmid, name="unburnt"))


def test_a_failed_clone_says_clone_failed(node, conn, vms, faults, tasks):
    newid = vms.track(vms.free_id())
    faults.set(fail_next_task={"message": "disk copy failed", "vmid": newid})
    status = tasks.wait(node.qemu(conn["template_vmid"]).clone.post(newid=newid, name="nope"))
    assert status["exitstatus"] == "clone failed: disk copy failed"
    assert newid not in {e["vmid"] for e in node.qemu.get()}


def test_the_next_requests_answer_5xx(node, conn, http, faults, vms):
    vmid = vms.create(name="outage")
    path = "/nodes/%s/qemu/%d" % (conn["pve_node"], vmid)  # only this VM's calls: others may use the lab too
    faults.set(fail_requests=2, status=503, message="lab outage", path=path)
    first = http.api("GET", path + "/status/current")
    assert (first.status_code, first.reason) == (503, "lab outage")
    with pytest.raises(ResourceException) as caught:
        node.qemu(vmid).status.current.get()
    assert (caught.value.status_code, caught.value.content) == (503, "lab outage")
    assert node.qemu(vmid).status.current.get()["status"] == "stopped"


def test_the_next_requests_answer_slowly_and_are_done_all_the_same(node, conn, http, faults, vms):
    vmid = vms.create(name="slowpoke")
    path = "/nodes/%s/qemu/%d/config" % (conn["pve_node"], vmid)
    faults.set(slow_requests=1, delay=3, method="POST", path=path)
    assert http.api("GET", path).status_code == 200  # a GET is not counted against the slow POST
    started = time.monotonic()
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(http.base + "/api2/json" + path, headers=http.token_headers(), data={"description": "late"},
                      verify=conn["ca_cert"], timeout=1)
    # The client gave up after 1 s; the lab handles the write after 3 s all the same, as a slow PVE would.
    deadline = time.monotonic() + 10
    while node.qemu(vmid).config.get().get("description") != "late":
        assert time.monotonic() < deadline, "the slow write was never done"
        time.sleep(0.2)
    assert time.monotonic() - started >= 2.5
    assert faults.state()["slow_requests"] == 0
    fast = time.monotonic()
    node.qemu(vmid).config.post(description="on time")
    assert time.monotonic() - fast < 2


def test_the_next_requests_have_their_connection_reset_and_are_not_done(node, conn, http, faults, vms):
    vmid = vms.create(name="reset")
    path = "/nodes/%s/qemu/%d/config" % (conn["pve_node"], vmid)
    faults.set(reset_requests=1, method="POST", path=path)
    assert http.api("GET", path).status_code == 200  # a GET is not counted against the POST
    with pytest.raises(requests.exceptions.ConnectionError):
        http.api("POST", path, data={"description": "lost"})
    assert faults.state()["reset_requests"] == 0
    assert node.qemu(vmid).config.get().get("description") is None  # never handled
    node.qemu(vmid).config.post(description="kept")
    assert node.qemu(vmid).config.get()["description"] == "kept"


def test_faults_refuse_what_they_do_not_understand(conn):
    url = "https://%s:%d/lab/faults" % (conn["api_host"], conn["api_port"])
    answer = requests.post(url, json={"fail_requests": -1}, verify=conn["ca_cert"], timeout=30)
    assert answer.status_code == 400
