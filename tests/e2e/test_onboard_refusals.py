"""Every way a node is refused by add_node / onboard_node on the lab: the plain message, and never ready.

Each refusal leaves the node in the registry as pending with the same message as its reason (so `bin/fleet status`
shows why). The kvm64 node is a real QEMU guest (slow to boot, slow to run Ansible on), so it is provisioned once,
in the background, while the other refusals run, and onboarded by the last test.
"""

import json
import os
import re
import subprocess
import warnings

import pytest
from helpers import BIN, PlaybookRun, ansible_env
from onboard_e2e import INVENTORY, Controller, assert_refused_not_ready, lab_engine, lab_session, task_results
from pve_vm_e2e import LAB_DIR, TIMEOUT, Lab
from test_engine_checks import copy_engine, pack, wrap_help

KVM64_NODE, KVM64_OCTET = "on-kvm64", 119
KVM64_VMID = 1000 + KVM64_OCTET
SPEED_PROBE = "Measure the node's speed against its own scalar baseline (llama-bench, the picked backend, then x64)"


@pytest.fixture(scope="module")
def lab():
    yield from lab_session(vmids=range(1113, 1120))


@pytest.fixture(scope="module")
def engine():
    return lab_engine()


class Background:
    """One ansible-playbook run started now and collected later."""

    def __init__(self, argv, env):
        self.argv, self.env = argv, env
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def again(self):
        """The same run once more, started now."""
        self.stop()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=self.env)

    def result(self):
        stdout, stderr = self.proc.communicate(timeout=TIMEOUT)
        return PlaybookRun(subprocess.CompletedProcess(self.proc.args, self.proc.returncode, stdout, stderr))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture(scope="module")
def kvm64_node(lab, engine, tmp_path_factory):
    """The one kvm64 VM of these tests: add_node runs for it in the background from the start of the module (a QEMU
    TCG guest takes minutes to boot and to run Ansible on), and the last test reads what it did."""
    controller = Controller(tmp_path_factory.mktemp("kvm64"), engine)
    extra = controller.extra_vars(KVM64_NODE, KVM64_OCTET, cpu="kvm64", allow_slow_cpu=True, provision_cores=2,
                                  provision_wait_timeout=600)
    argv = [os.path.join(BIN, "ansible-playbook"), "-i", INVENTORY, "llmgw.fleet.add_node", "-e", json.dumps(extra)]
    adding = Background(argv, ansible_env())
    try:
        yield controller, adding
    finally:
        adding.stop()


@pytest.fixture
def controller(tmp_path, engine, kvm64_node):
    # Asking for kvm64_node here starts the kvm64 node with the first test of the module.
    return Controller(tmp_path, engine)


def broken_archive(engine, tmp_path, filter_command):
    """The lab engine re-packed with llama-server's --help passed through ``filter_command``."""
    tree = copy_engine(engine, tmp_path / "llama-b11434")
    wrap_help(tree, "llama-server", filter_command)
    archive, digest = pack(tree, str(tmp_path))
    return {"fleet_engine_archive": archive, "fleet_engine_archive_sha256": digest}


def test_without_libgomp1_and_its_install_disabled_the_node_is_refused_then_the_fix_makes_it_ready(controller):
    node, octet = "on-gomp", 113
    refused = controller.play("add_node", node, octet, install_runtime_deps=False)
    assert_refused_not_ready(controller, refused, node, "on-gomp cannot serve with this engine",
                             "libgomp.so.1 is not installed", "apt-get install libgomp1")
    fixed = controller.play("onboard_node", node, octet)
    assert not fixed.failed, fixed.failure_messages()
    record = controller.record(node)
    assert record["state"] == "ready" and record["reasons"] == []


def test_an_engine_whose_help_lacks_a_flag_is_refused_naming_flag_and_version(controller, engine, tmp_path):
    node, octet = "on-norpc", 114
    run = controller.play("add_node", node, octet, **broken_archive(engine, tmp_path, "grep -v '^--rpc '"))
    record = assert_refused_not_ready(controller, run, node, "on-norpc cannot serve with this engine",
                                      "llama.cpp b11434 on this node lacks flags", "llama-server does not offer --rpc")
    assert record["engine_version"] == "b11434"
    assert not any("looks truncated" in m for m in run.failure_messages())


def test_a_help_cut_short_warns_and_is_refused(controller, engine, tmp_path):
    node, octet = "on-cut", 115
    run = controller.play("add_node", node, octet, **broken_archive(engine, tmp_path, "head -n 400"))
    assert_refused_not_ready(controller, run, node, "on-cut cannot serve with this engine",
                             "llama-server does not offer --port", "looks truncated")
    (flags,) = task_results(run, "Check every flag the launcher may pass against the engine's --help")
    assert any("400 lines" in warning for warning in flags["warnings"])


def test_a_hostname_or_vm_name_that_is_not_the_nodes_name_is_refused_naming_both(controller, lab):
    node, octet = "on-name", 116
    provisioned = controller.play("provision_node", node, octet)
    assert not provisioned.failed, provisioned.failure_messages()
    controller.ssh(node, octet, "sudo hostname on-other")
    run = controller.play("onboard_node", node, octet)
    assert_refused_not_ready(controller, run, node, "the node at 10.77.0.116 has hostname on-other, not its name "
                             "on-name", "onboard it under the name on-other")
    assert not os.path.exists(os.path.join(controller.ca_dir, "nodes", node, "node.crt"))

    controller.ssh(node, octet, "sudo hostname on-name")
    lab.client.update_config(lab.node, 1116, {"name": "on-renamed"}, TIMEOUT)
    run = controller.play("onboard_node", node, octet)
    assert_refused_not_ready(controller, run, node, "the VM at 10.77.0.116 (VMID 1116) is named on-renamed on "
                             "Proxmox VE, not on-name", "qm set 1116 --name on-name")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a node with 2 vCPUs or more")
def test_an_engine_held_to_one_thread_is_refused_naming_threads_and_vcpus_then_allowed_with_a_warning(controller):
    node, octet = "on-thread", 118
    vcpus = len(os.sched_getaffinity(0))  # an nspawn node sees the machine's CPUs
    run = controller.play("add_node", node, octet, engine_speed_threads=1)
    record = assert_refused_not_ready(controller, run, node, "on-thread cannot serve with this engine",
                                      "the engine runs 1 thread where the node has %d vCPUs" % vcpus,
                                      "--threads %d" % vcpus)
    (probe,) = task_results(run, SPEED_PROBE)
    assert probe["speed"]["threads"] == 1 and probe["speed"]["pp_ratio"] >= 2.0, probe
    assert record["state"] == "pending" and record["speed"] == probe["speed"]

    allowed = controller.play("add_node", node, octet, engine_speed_threads=1, allow_slow_node=True)
    assert not allowed.failed, allowed.failure_messages()
    (probe,) = task_results(allowed, SPEED_PROBE)
    assert any("registered anyway (allow_slow_node)" in w and "1 thread" in w for w in probe["warnings"]), probe
    assert controller.record(node)["state"] == "ready"


def guest_console_tail(vmid, lines=40):
    """The last lines of a QEMU guest's serial console as the lab logs it, colour codes taken out."""
    try:
        with open(os.path.join(LAB_DIR, "nodes", str(vmid), "console.log"), errors="replace") as handle:
            text = handle.read()
    except OSError as exc:
        return "(no console log: %s)" % exc
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "")
    return "\n".join(text.splitlines()[-lines:])


def never_came_up(run):
    """The run gave up waiting for a guest that never answered, neither its agent nor on the network."""
    silent = ("no route to the node", "the guest agent does not answer yet")
    return run.failed and any("was not ready after" in m and any(s in m for s in silent)
                              for m in run.failure_messages() if m)


def kvm64_result(adding):
    """The background run's result. A TCG guest that never came on the network at all is the lab's emulator failing,
    not the collection: its console is reported (a warning, and in the failure if it happens twice), the VM
    destroyed and the run made once more."""
    run = adding.result()
    if never_came_up(run):
        console = guest_console_tail(KVM64_VMID)
        warnings.warn("the kvm64 guest never came on the network; run repeated once. Its console ended:\n" + console,
                      stacklevel=2)
        Lab().destroy(KVM64_VMID)
        adding.again()
        run = adding.result()
        assert not never_came_up(run), (run.failure_messages(), guest_console_tail(KVM64_VMID))
    return run


def test_a_kvm64_vm_really_loads_x64_and_is_refused_naming_cpu_type_flags_and_fix(kvm64_node):
    controller, adding = kvm64_node
    run = kvm64_result(adding)
    (provisioned,) = task_results(run, "Clone, configure and start the VM")
    assert provisioned["cpu"] == "kvm64"
    assert_refused_not_ready(controller, run, KVM64_NODE, "on-kvm64 cannot serve with this engine",
                             "would run llama.cpp's x64", "the VM's CPU type kvm64 hides", "avx2", "cpu: host")
    (cpu,) = task_results(run, "Check the CPU backend llama.cpp loads here")
    assert cpu["loaded"] == "x64" == cpu["predicted"]
    assert cpu["load_backend_line"].endswith("/libggml-cpu-x64.so")
    assert controller.record(KVM64_NODE)["cpu_variant"] == "x64"
    # The speed probe says the same in numbers: the backend is the scalar baseline, ratio 1.
    (probe,) = task_results(run, SPEED_PROBE)
    assert probe["speed"]["variant"] == "x64" and probe["speed"]["pp_ratio"] == 1.0, probe
    assert controller.record(KVM64_NODE)["speed"] == probe["speed"]  # pending, with its numbers recorded
    assert any("its CPU backend x64 is the scalar baseline itself" in reason
               for reason in controller.record(KVM64_NODE)["reasons"])
    assert not any(r.get("msg", "").startswith("on-kvm64 is ready")
                   for r in task_results(run, "Print the time from nothing to ready"))
