"""The lab fault `pve_lab.nodes.hostile_boot`: a container node whose first boot replaces its host keys after sshd
answered, cloud-init still running.

The first tests only look at what arming writes (no lab needed); the last boots a node through the API (VMID and
address of the first-boot block: 1164, 10.77.0.164) and checks what the node did.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import time
from urllib.parse import quote

import pytest

from pve_lab.nodes import hostile_boot
from pve_lab.nodes.common import LabError

BOOT_TIMEOUT = 240
LIVE_VMID, LIVE_ADDRESS = 1164, "10.77.0.164"


def upper_file(state_dir, vmid, path):
    return os.path.join(hostile_boot.upper_dir(vmid, str(state_dir)), path.lstrip("/"))


def test_arm_writes_an_enabled_oneshot_unit_ordered_before_cloud_final(tmp_path):
    upper = hostile_boot.arm(4242, after_s=3, outage_s=2, trigger="client", state_dir=str(tmp_path))
    assert upper == str(tmp_path / "nodes" / "4242" / "upper")
    with open(upper_file(tmp_path, 4242, hostile_boot.UNIT_PATH)) as handle:
        unit = handle.read()
    for line in ("After=ssh.service", "Before=cloud-final.service", "Type=oneshot", "WantedBy=multi-user.target",
                 "ConditionPathExists=!" + hostile_boot.DONE_FILE, "AFTER_S=3 OUTAGE_S=2 TRIGGER=client"):
        assert line in unit, line
    assert os.readlink(upper_file(tmp_path, 4242, hostile_boot.WANTS_LINK)) == "/" + hostile_boot.UNIT_PATH
    script = upper_file(tmp_path, 4242, hostile_boot.SCRIPT_PATH)
    assert os.stat(script).st_mode & 0o777 == 0o755
    assert subprocess.run(["bash", "-n", script], capture_output=True, check=False).returncode == 0
    assert hostile_boot.is_armed(4242, state_dir=str(tmp_path))


def test_rearming_forgets_what_the_last_boot_did_and_disarm_removes_the_fault(tmp_path):
    state = str(tmp_path)
    hostile_boot.arm(4242, state_dir=state)
    for path, text in ((hostile_boot.LOG_FILE, "old SHA256:a\nnew SHA256:b\n"), (hostile_boot.DONE_FILE, "")):
        os.makedirs(os.path.dirname(upper_file(tmp_path, 4242, path)), exist_ok=True)
        with open(upper_file(tmp_path, 4242, path), "w") as handle:
            handle.write(text)
    assert hostile_boot.read_log(4242, state_dir=state) == {"old": "SHA256:a", "new": "SHA256:b"}
    hostile_boot.arm(4242, state_dir=state)
    assert hostile_boot.read_log(4242, state_dir=state) == {}
    assert not os.path.exists(upper_file(tmp_path, 4242, hostile_boot.DONE_FILE))
    hostile_boot.disarm(4242, state_dir=state)
    hostile_boot.disarm(4242, state_dir=state)
    assert not hostile_boot.is_armed(4242, state_dir=state)
    for path in (hostile_boot.UNIT_PATH, hostile_boot.SCRIPT_PATH, hostile_boot.WANTS_LINK):
        assert not os.path.lexists(upper_file(tmp_path, 4242, path))


@pytest.mark.parametrize("kwargs", [{"after_s": -1}, {"outage_s": -0.5}, {"trigger": "reboot"}])
def test_nonsense_is_refused(tmp_path, kwargs):
    with pytest.raises(LabError):
        hostile_boot.arm(4242, state_dir=str(tmp_path), **kwargs)
    assert not hostile_boot.is_armed(4242, state_dir=str(tmp_path))


def fingerprint(key_line: str) -> str:
    digest = hashlib.sha256(base64.b64decode(key_line.split()[1])).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def served_key(address: str) -> str:
    out = subprocess.run(["ssh-keyscan", "-T", "5", "-t", "ed25519", address], capture_output=True, text=True,
                         timeout=60, check=False).stdout
    keys = [line.split(None, 1)[1] for line in out.splitlines() if line and not line.startswith("#")]
    assert keys, "no host key from %s" % address
    return keys[0]


def agent_run(vm, argv):
    pid = vm.agent.exec.post(command=argv)["pid"]
    deadline = time.monotonic() + 60
    while True:
        status = vm.agent("exec-status").get(pid=pid)
        if status["exited"]:
            return status.get("out-data", "")
        assert time.monotonic() < deadline, status
        time.sleep(0.5)


def test_an_armed_node_replaces_its_keys_before_cloud_init_finishes(needs_guest, lab, node, conn, vms, tasks):
    if any(vm["vmid"] == LIVE_VMID for vm in node.qemu.get()):
        pytest.skip("VM %d exists already (another run of this test?)" % LIVE_VMID)
    with open(conn["ssh_public_key"]) as handle:
        key = handle.read().strip()
    vmid = vms.clone(newid=LIVE_VMID, name="fb-hostile-lab")
    vm = node.qemu(vmid)
    vm.config.put(cpu="host", agent=1, ciuser="debian", sshkeys=quote(key, safe=""),
                  ipconfig0="ip=%s/24,gw=%s" % (LIVE_ADDRESS, conn["gateway"]))
    hostile_boot.arm(vmid, after_s=2, outage_s=2)
    tasks.ok(vm.status.start.post())
    with pytest.raises(LabError):
        hostile_boot.disarm(vmid)  # the overlay is mounted now

    deadline = time.monotonic() + BOOT_TIMEOUT
    while "new" not in hostile_boot.read_log(vmid):
        assert time.monotonic() < deadline, "the fault did not act: %s" % hostile_boot.read_log(vmid)
        time.sleep(1)
    log = hostile_boot.read_log(vmid)
    assert log["old"].startswith("SHA256:") and log["old"] != log["new"]
    assert fingerprint(served_key(LIVE_ADDRESS)) == log["new"]

    # cloud-final (and so `cloud-init status: done`) started only after the fault had finished
    while "status: done" not in agent_run(vm, ["cloud-init", "status"]):
        assert time.monotonic() < deadline, "cloud-init did not finish"
        time.sleep(1)
    fault_exit = int(agent_run(vm, ["systemctl", "show", "--value", "-p", "ExecMainExitTimestampMonotonic",
                                    hostile_boot.UNIT_NAME]))
    final_start = int(agent_run(vm, ["systemctl", "show", "--value", "-p", "ExecMainStartTimestampMonotonic",
                                     "cloud-final.service"]))
    assert 0 < fault_exit <= final_start
