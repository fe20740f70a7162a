"""The Proxmox VE API misbehaving in the middle of add_node, through the lab's ``/lab/faults``; every row a whole
add_node run of a new node, then one ordinary run that must converge.

* 503 twice on the guest list (a read): the client tries again and the run goes on to ready, with the two 503s in
  the lab's request log;
* 503 once on the clone (a write): the run fails at once naming the 503 and the clone; the lab saw exactly one clone
  request (never repeated: it may have been done), no VM of that name exists, the node is not ready; the next run
  makes it ready;
* the clone task ending in ``TASK ERROR``: the run fails with PVE's own words for the task; no VM is left; the next
  run makes it ready;
* the guest list (a read) answered slower than the client's timeout (3 s here), twice: tried again, the run goes on
  to ready;
* the clone (a write) answered slower than the timeout, and done by the API all the same: the run fails at once,
  saying it did not repeat it; the lab saw one clone request; once the late clone's VM is there, the next run finds
  it and makes it ready, with one clone request in all and one VM of that name;
* the guest list's connection reset twice (TCP RST, nothing answered): tried again, the run goes on to ready;
* the clone's connection reset (the request never handled): the run fails at once saying it did not repeat it;
  no VM; the next run makes the node ready, with one clone done in all;
* a ready node's VM held by a backup (`lock: backup`) for 10 s when add_node runs again: the run waits for the
  lock, then goes on, and the node stays ready;
* with password auth, tickets that PVE takes for 4 s only (its two hours, shortened): the run logs in again where a
  ticket is refused and goes on to ready, with the 401s and the new logins in the lab's request log.

The test prints ``N faults, N failed or retried as they should, N converged``. Heavy (``make faults``): about six
minutes. Nodes af-node01..05 at 10.77.0.216-220 and af-node06..09 at 10.77.0.122-124 and 127; VMs af-* (VMIDs
1216-1220, 1122-1124, 1127) destroyed before and after.
"""

import os
import re
import threading
import time

import pytest
import requests
from helpers import REPO, run_playbook
from onboard_e2e import INVENTORY, Controller, lab_engine, lab_with_own_vms
from pve_vm_e2e import lab_is_up
from registry_check import violations

pytestmark = [pytest.mark.heavy,
              pytest.mark.skipif(not lab_is_up(), reason="the lab is not up (make lab-up)")]

PREFIX, OWN_VMIDS = "af-", list(range(1216, 1221)) + [1122, 1123, 1124, 1127]
# The speed probe is off: these rows prove what an API fault does, and a node measured while the lab is busy
# would be refused for its speed against peers measured at a quieter moment (make faults found it so).
OPTIONS = {"fabric": "ib-a", "gpus": 2, "gpu_type": "sim", "engine_speed_probe": False}
SERVER_LOG = os.path.join(REPO, ".lab", "api", "server.log")
RESULTS = []


class Faults:
    """The lab's /lab/faults: switch on; switch off only what this test switched on."""

    def __init__(self, lab):
        self.url = "https://%s:%s/lab/faults" % (lab.data.get("api_host", "127.0.0.1"), lab.data.get("api_port", 8006))
        self.ca = lab.data["ca_cert"]

    def call(self, method, payload):
        answer = requests.request(method, self.url, json=payload, verify=self.ca, timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.json()["data"]


@pytest.fixture(scope="module")
def lab():
    try:
        yield from lab_with_own_vms(PREFIX, OWN_VMIDS)
    finally:
        print("\nProxmox API faults across add_node: %d faults, %d failed or retried as they should, %d converged (%s)"
              % (len(RESULTS), sum(1 for r in RESULTS if r["as_it_should"]), sum(1 for r in RESULTS if r["converged"]),
                 "; ".join("%s: %s" % (r["fault"], r["seen"]) for r in RESULTS)))


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    return Controller(tmp_path_factory.mktemp("api-faults"), lab_engine())


@pytest.fixture
def faults(lab):
    switched = Faults(lab)
    payloads = []

    def switch(payload):
        payloads.append(payload)
        return switched.call("POST", payload)

    yield switch
    for payload in payloads:
        switched.call("DELETE", payload)


REQUEST_RE = re.compile(r'"(GET|POST|PUT|DELETE) /api2/json(\S*) HTTP/[\d.]+" (\d+)')


def log_from(offset):
    """The lab API's request log written since ``offset`` (a byte offset): (status, method, path) per request."""
    with open(SERVER_LOG, "rb") as handle:
        handle.seek(offset)
        text = handle.read().decode("utf-8", "replace")
    return [(int(m.group(3)), m.group(1), m.group(2)) for m in REQUEST_RE.finditer(text)]


def log_offset():
    return os.path.getsize(SERVER_LOG)


def new_row(fault):
    row = {"fault": fault, "as_it_should": False, "converged": False, "seen": "not reached"}
    RESULTS.append(row)
    return row


def converge(lab, controller, node, octet, row):
    again = add_node(controller, node, octet)
    assert not again.failed, again.failure_messages()
    record = controller.record(node)
    assert record["state"] == "ready", record
    assert len([g for g in lab.client.qemu_vms() if g.get("name") == node]) == 1
    assert violations(controller.registry) == []
    row["converged"] = True


def add_node(controller, node, octet, **overrides):
    """One ``ansible-playbook llmgw.fleet.add_node`` of ``node`` with the lab inventory (``overrides``: extra vars)."""
    return run_playbook("llmgw.fleet.add_node", controller.extra_vars(node, octet, **OPTIONS, **overrides),
                        inventory=INVENTORY)


def template_clone_path(lab):
    return "/nodes/%s/qemu/%s/clone" % (lab.node, lab.data["template_vmid"])


def failure_text(run):
    return "\n".join(str(m) for m in run.failure_messages() if m)


def test_reads_answered_503_twice_are_tried_again_and_the_run_goes_on(lab, controller, faults):
    node, octet = "af-node01", 216
    row = new_row("503 twice on GET /cluster/resources")
    start = log_offset()
    faults({"fail_requests": 2, "status": 503, "message": "lab outage", "path": "/cluster/resources"})
    run = add_node(controller, node, octet)
    assert not run.failed, failure_text(run)
    answered = [entry for entry in log_from(start) if entry[2].startswith("/cluster/resources")]
    assert [status for status, _method, _path in answered[:3]] == [503, 503, 200], answered[:5]
    row["as_it_should"], row["seen"] = True, "retried, ready"
    converge(lab, controller, node, octet, row)


def test_a_write_answered_503_fails_at_once_and_is_never_repeated(lab, controller, faults):
    node, octet = "af-node02", 217
    row = new_row("503 once on POST .../clone")
    clone_path = template_clone_path(lab)
    start = log_offset()
    faults({"fail_requests": 1, "status": 503, "message": "lab outage", "path": clone_path})
    run = add_node(controller, node, octet)
    assert run.failed
    text = failure_text(run)
    assert "POST %s: HTTP 503: lab outage; not repeated, since it may have been done" % clone_path in text, text
    clones = [entry for entry in log_from(start) if entry[1] == "POST" and entry[2] == clone_path]
    assert [status for status, _method, _path in clones] == [503], clones
    assert lab.vm(node) is None
    record = controller.record(node)
    assert record is None or record["state"] != "ready", record
    row["as_it_should"], row["seen"] = True, "failed at once, 1 clone request"
    converge(lab, controller, node, octet, row)


def test_a_clone_task_that_ends_in_error_fails_the_run_with_its_words(lab, controller, faults):
    node, octet = "af-node03", 218
    vmid = 1000 + octet
    row = new_row("the clone task ends in TASK ERROR")
    faults({"fail_next_task": {"message": "disk copy failed", "type": "qmclone", "vmid": vmid}})
    run = add_node(controller, node, octet)
    assert run.failed
    text = failure_text(run)
    assert "clone failed: disk copy failed" in text, text
    assert lab.vm(node) is None
    row["as_it_should"], row["seen"] = True, "failed with the task's words"
    converge(lab, controller, node, octet, row)


def slow_client(lab, seconds=3):
    """fleet_proxmox with the lab's connection and an HTTP timeout of ``seconds`` (api_timeout)."""
    return {"fleet_proxmox": {"api_host": lab.data["api_host"], "api_port": lab.data["api_port"],
                              "api_token_id": lab.data["api_token_id"],
                              "api_token_secret": lab.data["api_token_secret"], "ca_path": lab.data["ca_cert"],
                              "api_timeout": seconds}}


def test_reads_slower_than_the_timeout_are_tried_again_and_the_run_goes_on(lab, controller, faults):
    node, octet = "af-node04", 219
    row = new_row("GET /cluster/resources slower than the 3 s timeout, twice")
    start = log_offset()
    faults({"slow_requests": 2, "delay": 5, "method": "GET", "path": "/cluster/resources"})
    run = add_node(controller, node, octet, **slow_client(lab))
    assert not run.failed, failure_text(run)
    assert Faults(lab).call("GET", None)["slow_requests"] == 0
    reads = [entry for entry in log_from(start) if entry[1] == "GET" and entry[2].startswith("/cluster/resources")]
    assert len(reads) >= 3, reads
    row["as_it_should"], row["seen"] = True, "retried, ready"
    converge(lab, controller, node, octet, row)


def test_a_write_slower_than_the_timeout_fails_at_once_and_the_next_run_finds_what_it_did(lab, controller, faults):
    node, octet = "af-node05", 220
    row = new_row("POST .../clone slower than the 3 s timeout, done late")
    clone_path = template_clone_path(lab)
    start = log_offset()
    faults({"slow_requests": 1, "delay": 5, "method": "POST", "path": clone_path})
    run = add_node(controller, node, octet, **slow_client(lab))
    assert run.failed
    text = failure_text(run)
    assert re.search(r"POST %s: the Proxmox API did not answer .* in time: .*; not repeated, since it may have been "
                     r"done" % re.escape(clone_path), text), text
    clones = [entry for entry in log_from(start) if entry[1] == "POST" and entry[2] == clone_path]
    assert len(clones) <= 1, clones  # the late one is logged once it is answered
    # The API did the write all the same: its VM appears. (A run started before that tries its own clone, which PVE
    # refuses since the VMID, the address's, is taken: one run of this row saw that, and converged all the same.)
    deadline = time.monotonic() + 60
    while lab.vm(node) is None:
        assert time.monotonic() < deadline, "the late clone never made its VM"
        time.sleep(0.5)
    row["as_it_should"], row["seen"] = True, "failed at once, 1 clone request, done late"
    converge(lab, controller, node, octet, row)
    clones = [entry for entry in log_from(start) if entry[1] == "POST" and entry[2] == clone_path]
    assert clones == [(200, "POST", clone_path)], clones


def test_tickets_that_expire_mid_run_are_replaced_by_a_new_login(lab, controller, faults):
    node, octet = "af-node06", 122
    row = new_row("tickets valid for 4 s (password auth)")
    password = {"fleet_proxmox": {"api_host": lab.data["api_host"], "api_port": lab.data["api_port"],
                                  "api_user": lab.data["api_user"], "api_password": lab.data["api_password"],
                                  "ca_path": lab.data["ca_cert"]}}
    start = log_offset()
    faults({"ticket_lifetime": 4})
    # pve_vm's first read of the new VM's config answered after 6 s: its session outlives its ticket there, and its
    # next call (the config write) meets the refusal, whatever the speed of the rest of the run
    faults({"slow_requests": 1, "delay": 6, "method": "GET", "path": "/nodes/%s/qemu/1122/config" % lab.node})
    run = add_node(controller, node, octet, **password)
    assert not run.failed, failure_text(run)
    seen = log_from(start)
    refused = [entry for entry in seen if entry[0] == 401]
    logins = [entry for entry in seen if entry[1] == "POST" and entry[2] == "/access/ticket"]
    assert refused, "no ticket outlived 4 s: the row tested nothing"
    assert Faults(lab).call("GET", None)["slow_requests"] == 0
    assert len(logins) > len(refused), (refused, logins)  # each refusal was followed by a login
    row["as_it_should"], row["seen"] = True, "%d tickets refused, logged in again, ready" % len(refused)
    converge(lab, controller, node, octet, row)


def test_reads_whose_connection_is_reset_are_tried_again(lab, controller, faults):
    node, octet = "af-node07", 123
    row = new_row("connection reset twice on GET /cluster/resources")
    faults({"reset_requests": 2, "method": "GET", "path": "/cluster/resources"})
    run = add_node(controller, node, octet)
    assert not run.failed, failure_text(run)
    assert Faults(lab).call("GET", None)["reset_requests"] == 0
    row["as_it_should"], row["seen"] = True, "retried, ready"
    converge(lab, controller, node, octet, row)


def test_a_write_whose_connection_is_reset_fails_at_once_and_is_never_repeated(lab, controller, faults):
    node, octet = "af-node08", 124
    row = new_row("connection reset on POST .../clone")
    clone_path = template_clone_path(lab)
    start = log_offset()
    faults({"reset_requests": 1, "method": "POST", "path": clone_path})
    run = add_node(controller, node, octet)
    assert run.failed
    text = failure_text(run)
    assert re.search(r"POST %s: cannot reach the Proxmox API .*; not repeated, since it may have been done"
                     % re.escape(clone_path), text), text
    assert Faults(lab).call("GET", None)["reset_requests"] == 0  # the one clone request was the one reset
    assert [entry for entry in log_from(start) if entry[1] == "POST" and entry[2] == clone_path] == []
    assert lab.vm(node) is None
    row["as_it_should"], row["seen"] = True, "failed at once, not repeated, no VM"
    converge(lab, controller, node, octet, row)
    clones = [entry for entry in log_from(start) if entry[1] == "POST" and entry[2] == clone_path]
    assert clones == [(200, "POST", clone_path)], clones


def test_a_backup_lock_is_waited_for_and_the_run_goes_on(lab, controller, faults):
    node, octet = "af-node09", 127
    row = new_row("lock: backup held for 10 s on a ready node's VM")
    first = add_node(controller, node, octet)
    assert not first.failed, failure_text(first)
    vmid = lab.vm(node)["vmid"]
    faults({"lock": {"vmid": vmid, "lock": "backup"}})
    release = threading.Timer(10, lambda: Faults(lab).call("POST", {"lock": {"vmid": vmid, "lock": None}}))
    release.start()
    started = time.monotonic()
    try:
        again = add_node(controller, node, octet)
    finally:
        release.join()
    assert not again.failed, failure_text(again)
    assert time.monotonic() - started >= 10  # it waited for the backup, it did not go around it
    assert "lock" not in lab.config(vmid) and controller.record(node)["state"] == "ready"
    row["as_it_should"], row["seen"] = True, "waited %.0f s, ready" % (time.monotonic() - started)
    converge(lab, controller, node, octet, row)
