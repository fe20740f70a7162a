"""The node backend for real: container nodes and a QEMU guest boot, run cloud-init, answer ssh, stay inside.

Needs root and the lab's Debian packages (tests/lab/apt-packages.txt); the first run builds the template
(a few minutes), later runs reuse it. Timings are printed (run with -s), never asserted.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import time
import uuid
from typing import Dict

import pytest

from pve_lab.nodes import container, network
from pve_lab.nodes.backend import AgentNotRunning, NodeBackend
from pve_lab.nodes.common import BRIDGE, LINK_PREFIX, NETNS_PREFIX, lab_processes, netns_name, veth_name
from pve_lab.nodes.spec import VMSpec

REQUIRED_TOOLS = ("debootstrap", "systemd-nspawn", "qemu-system-x86_64", "qemu-img", "genisoimage",
                  "dpkg-scanpackages", "ssh", "ssh-keygen", "ssh-keyscan", "ip", "nsenter")
MISSING = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab's nodes need root"),
    pytest.mark.skipif(bool(MISSING), reason="missing tools (tests/lab/apt-packages.txt): %s" % " ".join(MISSING)),
]

# VMIDs and addresses of their own, so a lab that is up is left alone
NODE_A = (9901, "10.77.0.231")
NODE_B = (9902, "10.77.0.232")
NODE_NO_OS = (9903, "10.77.0.233")
NODE_KVM64 = (9910, "10.77.0.240")
OWN_VMIDS = (NODE_A[0], NODE_B[0], NODE_NO_OS[0], NODE_KVM64[0])
CONTAINER_SSH_TIMEOUT = 90
QEMU_SSH_TIMEOUT = 480


def timing(label: str, seconds: float) -> None:
    print("\nTIMING %s: %.1f s" % (label, seconds))


def lab_is_up() -> bool:
    """Anything of a running lab: its processes, its bridge, or its API answering on 127.0.0.1:8006."""
    if lab_processes() or network.link_exists(BRIDGE):
        return True
    try:
        socket.create_connection(("127.0.0.1", 8006), timeout=1).close()
        return True
    except OSError:
        return False


def ip_forward() -> str:
    with open("/proc/sys/net/ipv4/ip_forward") as handle:
        return handle.read().strip()


class Lab:
    def __init__(self, backend: NodeBackend, tmp: str):
        self.backend = backend
        self.tmp = tmp
        self.key = os.path.join(tmp, "id_ed25519")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "lab-test", "-f", self.key], check=True)
        with open(self.key + ".pub") as handle:
            self.public_key = handle.read().strip()

    def spec(self, node, name: str, cpu, has_os: bool = True) -> VMSpec:
        vmid, ip = node
        return VMSpec(vmid=vmid, name=name, cpu=cpu, cores=2, memory=2048, has_os=has_os, agent=True, ciuser="ops",
                      sshkeys=self.public_key + "\n", ipconfig0="ip=%s/24,gw=10.77.0.1" % ip, nameserver=None,
                      searchdomain=None, instance_id=uuid.uuid4().hex)

    def ssh(self, ip: str, command: str, known_hosts: str, timeout: float = 120) -> subprocess.CompletedProcess:
        argv = ["ssh", "-F", "/dev/null", "-i", self.key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=accept-new", "-o", "UserKnownHostsFile=%s" % known_hosts,
                "-o", "ConnectTimeout=3", "-o", "LogLevel=ERROR", "ops@%s" % ip, command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    def wait_ssh(self, ip: str, known_hosts: str, deadline_s: float) -> float:
        started = time.monotonic()
        while time.monotonic() - started < deadline_s:
            if self.ssh(ip, "true", known_hosts, timeout=30).returncode == 0:
                return time.monotonic() - started
            time.sleep(0.5)
        raise AssertionError("no ssh on %s within %d s" % (ip, deadline_s))

    def boot(self, node, name: str, cpu, timeout: float) -> Dict[str, object]:
        spec = self.spec(node, name, cpu)
        known_hosts = os.path.join(self.tmp, "known_hosts-%s" % spec.instance_id)
        started = time.monotonic()
        self.backend.start(spec)
        assert self.backend.is_running(spec.vmid)
        self.wait_ssh(node[1], known_hosts, timeout)
        return {"spec": spec, "ip": node[1], "known_hosts": known_hosts, "boot_to_ssh": time.monotonic() - started}

    def run(self, node: Dict[str, object], command: str) -> str:
        proc = self.ssh(node["ip"], command, node["known_hosts"])
        assert proc.returncode == 0, "%r failed on %s: %s" % (command, node["ip"], proc.stderr)
        return proc.stdout

    def host_key(self, node: Dict[str, object]) -> str:
        """The ed25519 host key the node's sshd serves (ssh-keyscan's key field)."""
        out = subprocess.run(["ssh-keyscan", "-T", "5", "-t", "ed25519", node["ip"]], capture_output=True, text=True,
                             timeout=30, check=False).stdout
        keys = [line.split()[2] for line in out.splitlines() if line and not line.startswith("#")]
        assert keys, "no host key from %s" % node["ip"]
        return keys[0]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab_was_up = lab_is_up()
    backend = NodeBackend(state_dir=str(tmp_path_factory.mktemp("lab-state")))
    forward_before = ip_forward()
    built_before = backend.template.is_current()
    started = time.monotonic()
    backend.prepare()
    timing("prepare (%s)" % ("template cached" if built_before else "template built"), time.monotonic() - started)
    lab = Lab(backend, str(tmp_path_factory.mktemp("lab-ssh")))
    lab.lab_was_up = lab_was_up
    lab.forward_before = forward_before
    yield lab
    for vmid in OWN_VMIDS:
        backend.destroy(vmid)
    if not lab_was_up:
        backend.teardown_all()


@pytest.fixture(scope="module")
def nodes(lab):
    a = lab.boot(NODE_A, "lab-node-a", "host", CONTAINER_SSH_TIMEOUT)
    timing("container boot to ssh (%s)" % a["spec"].name, a["boot_to_ssh"])
    b = lab.boot(NODE_B, "lab-node-b", "host", CONTAINER_SSH_TIMEOUT)
    timing("container boot to ssh (%s)" % b["spec"].name, b["boot_to_ssh"])
    return {"a": a, "b": b}


def test_template_has_no_host_keys_no_libgomp_and_only_the_mirror(lab):
    rootfs = lab.backend.template.rootfs
    assert not [name for name in os.listdir(os.path.join(rootfs, "etc/ssh")) if name.startswith("ssh_host_")]
    with open(os.path.join(rootfs, "var/lib/dpkg/status")) as handle:
        status = handle.read()
    assert "\nPackage: cloud-init\n" in status
    assert "\nPackage: libgomp1\n" not in status
    with open(os.path.join(rootfs, "etc/apt/sources.list")) as handle:
        assert handle.read() == "deb [trusted=yes] http://10.77.0.254:8099/ ./\n"
    assert not os.listdir(os.path.join(rootfs, "etc/apt/sources.list.d"))


def test_container_nodes_are_named_and_finish_cloud_init(lab, nodes):
    for node in nodes.values():
        assert lab.run(node, "hostname").strip() == node["spec"].name
        status = lab.run(node, "cloud-init status --wait")
        assert "status: done" in status
        assert lab.run(node, "id -un").strip() == "ops"
        assert lab.run(node, "sudo -n id -u").strip() == "0"
        assert lab.run(node, "ls /var/lib/cloud/instances").split() == [node["spec"].instance_id]


def test_each_node_has_its_own_host_key_and_recreation_changes_it(lab, nodes):
    key_a, key_b = lab.host_key(nodes["a"]), lab.host_key(nodes["b"])
    assert key_a != key_b
    lab.backend.destroy(NODE_A[0])
    assert not lab.backend.is_running(NODE_A[0])
    nodes["a"] = lab.boot(NODE_A, "lab-node-a", "host", CONTAINER_SSH_TIMEOUT)
    timing("container boot to ssh (re-created %s)" % nodes["a"]["spec"].name, nodes["a"]["boot_to_ssh"])
    assert lab.run(nodes["a"], "cloud-init status --wait").strip().endswith("done")
    assert lab.host_key(nodes["a"]) not in (key_a, key_b)


def test_libgomp1_installs_from_the_lab_mirror(lab, nodes):
    node = nodes["b"]
    assert lab.ssh(node["ip"], "dpkg -s libgomp1", node["known_hosts"]).returncode != 0
    assert lab.run(node, "cat /etc/apt/sources.list").strip() == "deb [trusted=yes] http://10.77.0.254:8099/ ./"
    lab.run(node, "sudo -n apt-get update -q && sudo -n DEBIAN_FRONTEND=noninteractive apt-get install -y -q libgomp1")
    assert "Status: install ok installed" in lab.run(node, "dpkg -s libgomp1")
    assert lab.run(node, "ls /usr/lib/x86_64-linux-gnu/").count("libgomp.so.1") >= 1


def test_nodes_have_no_way_out(lab, nodes):
    node = nodes["a"]
    route = lab.run(node, "ip route get 1.1.1.1")
    assert "via 10.77.0.1 dev eth0" in route
    assert lab.run(node, "ip -4 route show default").split()[:3] == ["default", "via", "10.77.0.1"]
    # the gateway is an address nobody holds: the first hop already fails (lab traffic only, on the bridge)
    probe = "python3 -c \"import socket; socket.create_connection(('10.77.0.1', 22), timeout=5)\""
    assert lab.ssh(node["ip"], probe, node["known_hosts"]).returncode != 0
    # and the host would not forward even if it were reached
    assert ip_forward() == "0" == lab.forward_before
    # the container cannot change its links (no CAP_NET_ADMIN), so it cannot add a route of its own
    assert lab.ssh(node["ip"], "sudo -n ip link set eth0 down", node["known_hosts"]).returncode != 0


def test_agent_runs_commands_inside_the_container(lab, nodes):
    vmid = NODE_A[0]
    assert lab.backend.agent_ping(vmid) == {}
    started = lab.backend.agent_exec(vmid, ["sh", "-c", "hostname; cat; exit 7"], input_data="from-stdin\n")
    deadline = time.monotonic() + 30
    status = lab.backend.agent_exec_status(vmid, started["pid"])
    while not status["exited"] and time.monotonic() < deadline:
        time.sleep(0.2)
        status = lab.backend.agent_exec_status(vmid, started["pid"])
    assert status["exited"] and status["exitcode"] == 7
    assert base64.b64decode(status["out-data"]).decode() == "lab-node-a\nfrom-stdin\n"
    interfaces = {i["name"]: i for i in lab.backend.agent_network_interfaces(vmid)}
    assert set(interfaces) == {"lo", "eth0"}
    assert interfaces["eth0"]["hardware-address"] == "bc:24:11:00:26:ad"
    addresses = [a["ip-address"] for a in interfaces["eth0"]["ip-addresses"]]
    assert NODE_A[1] in addresses


def test_vm_without_os_runs_but_never_answers(lab):
    spec = lab.spec(NODE_NO_OS, "lab-no-os", None, has_os=False)
    lab.backend.start(spec)
    try:
        assert lab.backend.is_running(spec.vmid)
        time.sleep(10)
        assert lab.backend.is_running(spec.vmid)
        proc = lab.ssh(NODE_NO_OS[1], "true", os.path.join(lab.tmp, "known_hosts-no-os"), timeout=30)
        assert proc.returncode == 255
        with pytest.raises(AgentNotRunning):
            lab.backend.agent_ping(spec.vmid)
    finally:
        lab.backend.stop(spec.vmid)
    assert not lab.backend.is_running(spec.vmid)


# tests/e2e/test_onboard_refusals.py boots a kvm64 guest too, and shows x64 loading in it, in every make test.
@pytest.mark.heavy
def test_kvm64_guest_boots_under_qemu_without_the_host_features(lab, nodes):
    guest = lab.boot(NODE_KVM64, "lab-kvm64", None, QEMU_SSH_TIMEOUT)
    timing("QEMU kvm64 boot to ssh", guest["boot_to_ssh"])
    assert lab.run(guest, "hostname").strip() == "lab-kvm64"
    assert "status: done" in lab.run(guest, "cloud-init status --wait")
    guest_flags = set(lab.run(guest, "grep -m1 ^flags /proc/cpuinfo").split(":", 1)[1].split())
    node_flags = set(lab.run(nodes["a"], "grep -m1 ^flags /proc/cpuinfo").split(":", 1)[1].split())
    with open("/proc/cpuinfo") as handle:
        host_flags = set(next(line for line in handle if line.startswith("flags")).split(":", 1)[1].split())
    assert node_flags == host_flags  # a host-model node sees this machine's CPU
    assert "avx2" not in guest_flags and "sse4_2" not in guest_flags  # kvm64 has neither
    assert {"lahf_lm", "sep", "sse2"} <= guest_flags
    if "avx2" in host_flags:
        assert "avx2" in node_flags
    started = lab.backend.agent_exec(NODE_KVM64[0], ["hostname"])
    deadline = time.monotonic() + 60
    status = lab.backend.agent_exec_status(NODE_KVM64[0], started["pid"])
    while not status["exited"] and time.monotonic() < deadline:
        time.sleep(0.5)
        status = lab.backend.agent_exec_status(NODE_KVM64[0], started["pid"])
    assert base64.b64decode(status["out-data"]).decode().strip() == "lab-kvm64"
    lab.backend.destroy(NODE_KVM64[0])
    assert not lab.backend.is_running(NODE_KVM64[0])
    assert not network.link_exists("llmgwt%d" % NODE_KVM64[0])
    assert not os.path.exists(lab.backend.node_dir(NODE_KVM64[0]))


def test_stop_releases_the_node_and_destroy_removes_its_disk(lab, nodes):
    vmid = NODE_B[0]
    node_dir = lab.backend.node_dir(vmid)
    lab.backend.stop(vmid)
    lab.backend.stop(vmid)  # idempotent
    assert not lab.backend.is_running(vmid)
    assert not os.path.ismount(container.root_dir(node_dir))
    assert not os.path.exists("/run/netns/" + netns_name(vmid))
    assert not network.link_exists(veth_name(vmid))
    assert os.path.isdir(os.path.join(node_dir, "upper", "etc", "ssh"))  # the disk survives a stop
    lab.backend.destroy(vmid)
    lab.backend.destroy(vmid)
    assert not os.path.exists(node_dir)


def test_teardown_all_leaves_nothing_behind(lab, nodes):
    if lab.lab_was_up:
        pytest.skip("a lab was up before these tests; teardown_all would take it down")
    assert lab.backend.is_running(NODE_A[0])
    lab.backend.teardown_all()
    assert not lab.backend.is_running(NODE_A[0])
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert NETNS_PREFIX not in netns
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert LINK_PREFIX not in links
    with open("/proc/self/mounts") as handle:
        assert "llmgw" not in handle.read()
    assert lab_processes() == []
    ps = subprocess.run(["ps", "-eo", "ppid=,stat=,args="], capture_output=True, text=True, check=True).stdout
    ours = [line for line in ps.splitlines() if line.split()[0] == str(os.getpid())]
    assert not [line for line in ours if any(word in line for word in ("nspawn", "qemu-system", "http.server"))]
    assert not [line for line in ours if line.split()[1].startswith("Z")]
