"""Guest agent endpoints: ping, exec, exec-status, network-get-interfaces (delegated to the node backend)."""

import time
from urllib.parse import quote

import pytest
from proxmoxer import ResourceException

BOOT_TIMEOUT = 180


def test_agent_needs_to_be_configured(node, vms):
    vmid = vms.create(name="noagent", memory=128)
    with pytest.raises(ResourceException) as caught:
        node.qemu(vmid).agent.ping.post()
    assert (caught.value.status_code, caught.value.content) == (500, "No QEMU guest agent configured")


def test_agent_of_a_stopped_vm(node, vms):
    vmid = vms.clone(name="agentstopped")
    with pytest.raises(ResourceException) as caught:
        node.qemu(vmid).agent.ping.post()
    assert caught.value.content == "VM %d is not running" % vmid


def test_agent_of_a_vm_without_os_never_answers(node, vms, tasks):
    vmid = vms.create(name="noos", memory=128, agent=1)
    tasks.ok(node.qemu(vmid).status.start.post())
    for call in (node.qemu(vmid).agent.ping.post,
                 lambda: node.qemu(vmid).agent.exec.post(command=["true"])):
        with pytest.raises(ResourceException) as caught:
            call()
        assert caught.value.content == "QEMU guest agent is not running"


def _wait_agent(vm) -> None:
    deadline = time.monotonic() + BOOT_TIMEOUT
    while True:
        try:
            vm.agent.ping.post()
            return
        except ResourceException:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def _exec(vm, command, **extra) -> dict:
    pid = vm.agent.exec.post(command=command, **extra)["pid"]
    deadline = time.monotonic() + 60
    while True:
        status = vm.agent("exec-status").get(pid=pid)
        if status["exited"]:
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.5)


def test_agent_runs_commands_inside_the_node(needs_guest, node, conn, vms, tasks):
    address = "10.77.0.%d" % (200 + int(vms.free_id()) % 50)
    with open(conn["ssh_public_key"]) as handle:
        key = handle.read().strip()
    vmid = vms.clone(name="agentnode")
    vm = node.qemu(vmid)
    vm.config.put(cpu="host", ciuser="debian", sshkeys=quote(key, safe=""),
                  ipconfig0="ip=%s/24,gw=%s" % (address, conn["gateway"]))
    tasks.ok(vm.status.start.post())
    _wait_agent(vm)
    assert vm.agent.ping.post() == {"result": {}}
    hostname = _exec(vm, ["hostname"])
    assert (hostname["exitcode"], hostname["out-data"].strip()) == (0, "agentnode")
    echoed = _exec(vm, ["cat"], **{"input-data": "through stdin"})
    assert echoed["out-data"] == "through stdin"
    interfaces = vm.agent("network-get-interfaces").get()["result"]
    addresses = {a["ip-address"] for i in interfaces for a in i.get("ip-addresses", [])}
    assert address in addresses
