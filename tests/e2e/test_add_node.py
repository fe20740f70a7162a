"""add_node on the lab, the way an operator runs it: from nothing to registered ready, then nothing to change.

    ansible-playbook -i inventories/lab llmgw.fleet.add_node -e node=on-add -e address=10.77.0.112/24 -e fabric=ib-a

Controller state (known_hosts, fleet CA, registry) lives under the test's directory; the VM is removed afterwards.
"""

import os

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import NameOID
from onboard_e2e import Controller, assert_refused_not_ready, lab_engine, lab_session, task_results

from ansible_collections.llmgw.fleet.plugins.module_utils import ggml_cpu_variants as gcv

NODE, OCTET = "on-add", 112
SPEED_PROBE = "Measure the node's speed against its own scalar baseline (llama-bench, the picked backend, then x64)"
ASK = "Ask whether the engine is installed and its checks passed for exactly what this node has now"
COMPLETION = "Check that llama-server answers a completion on a quantized model, and with which arguments"
IDENTITY_MODULES = "Make or check with community.crypto what is missing, differs or must be issued"
VM_READ = "Identity | read the VM through the Proxmox VE API"
TLS_COPY = "Certificates | copy the fleet CA certificate, the node's certificate and its key to the node"
LIBGOMP = "/usr/lib/x86_64-linux-gnu/libgomp.so.1"


@pytest.fixture(scope="module")
def lab():
    yield from lab_session(vmids=range(1112, 1113))


@pytest.fixture(scope="module")
def engine():
    return lab_engine()


def changed_everywhere(run):
    """Changed tasks over every host of the run (the controller and the node)."""
    return sum(stats["changed"] for stats in run.report["stats"].values())


def changed_tasks(run):
    return [task["task"]["name"] for play in run.report["plays"] for task in play["tasks"]
            if any(result.get("changed") for result in task["hosts"].values())]


def colon_fingerprint(cert):
    return ":".join("%02x" % b for b in cert.fingerprint(hashes.SHA256()))


def test_add_node_from_nothing_to_ready_then_nothing_to_change(lab, engine, tmp_path):
    controller = Controller(tmp_path, engine)
    options = dict(fabric="ib-a", gpus=2, gpu_type="sim")

    predicted = controller.play("add_node", NODE, OCTET, check=True, **options)
    assert not predicted.failed, predicted.failure_messages()
    assert changed_everywhere(predicted) > 0
    assert lab.vm(NODE) is None and controller.record(NODE) is None

    first = controller.play("add_node", NODE, OCTET, **options)
    assert not first.failed, first.failure_messages()
    (timing,) = first.results("Print the time from nothing to ready")
    assert timing["msg"].startswith("on-add is ready: ") and "from nothing to registered ready" in timing["msg"]
    print(timing["msg"])  # the figure, for people (pytest -s); no assertion on time

    record = controller.record(NODE)
    with open("/proc/cpuinfo") as handle:
        host_variant = gcv.predict(gcv.parse_cpuinfo_flags(handle.read()))["variant"]
    with open(os.path.join(controller.ca_dir, "nodes", NODE, "node.crt"), "rb") as handle:
        cert = x509.load_pem_x509_certificate(handle.read())
    assert record["state"] == "ready" and record["reasons"] == []
    assert (record["address"], record["vmid"], record["proxmox_node"]) == ("10.77.0.112", 1112, lab.node)
    assert (record["fabric"], record["gpu_count"], record["gpu_type"]) == ("ib-a", 2, "sim")
    assert (record["cpu_variant"], record["engine_version"]) == (host_variant, "b11434")
    assert record["engine_args"] in ([], ["--no-repack"])  # what the completion probe found this CPU needs
    assert record["cert_fingerprint"] == colon_fingerprint(cert)
    # The speed probe measured the node against its own scalar baseline, and the registry keeps the numbers.
    speed = record["speed"]
    assert speed["variant"] == host_variant and speed["threads"] == speed["vcpus"] >= 1, speed
    assert speed["pp_ratio"] >= 2.0 and speed["pp"] > speed["baseline_pp"] > 0, speed
    (probe,) = task_results(first, SPEED_PROBE)
    assert probe["speed"] == speed and len(probe["ran"]) in (2, 4, 6), probe  # a pair, measured again if skewed
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == NODE

    on_node = controller.ssh(NODE, OCTET, "hostname; sudo stat -c '%n %a %U' /etc/llmgw/tls/ca.crt "
                             "/etc/llmgw/tls/node.crt /etc/llmgw/tls/node.key; sudo cat /etc/llmgw/tls/node.crt")
    lines = on_node.splitlines()
    assert lines[:4] == [NODE, "/etc/llmgw/tls/ca.crt 644 root", "/etc/llmgw/tls/node.crt 644 root",
                         "/etc/llmgw/tls/node.key 600 root"]
    assert x509.load_pem_x509_certificate("\n".join(lines[4:]).encode()) == cert

    second = controller.play("add_node", NODE, OCTET, **options)
    assert not second.failed, second.failure_messages()
    assert set(second.report["stats"]) == {"localhost", NODE}
    assert changed_everywhere(second) == 0, changed_tasks(second)
    assert controller.record(NODE) == record
    # The engine checks passed for exactly what the node has: the re-run takes their record instead of repeating them.
    (asked,) = task_results(second, ASK)
    assert asked["current"] is True and asked["report"]["ready"] is True, asked
    assert not [r for r in task_results(second, COMPLETION) if not r.get("skipped")]
    assert not [r for r in task_results(second, SPEED_PROBE) if not r.get("skipped")]
    # Nor does it start community.crypto's modules for an identity in place, or copy TLS files the node holds.
    assert [r.get("skipped") for r in task_results(second, IDENTITY_MODULES)] == [True]
    assert [r.get("skipped") for r in task_results(second, TLS_COPY)] == [True]
    # add_node's onboarding takes the VM from pve_vm's answer in the same run, not from a second API read.
    assert [r.get("skipped") for r in task_results(second, VM_READ)] == [True]

    again = controller.play("add_node", NODE, OCTET, check=True, **options)
    assert not again.failed, again.failure_messages()
    assert set(again.report["stats"]) == {"localhost", NODE}
    assert changed_everywhere(again) == 0, changed_tasks(again)

    # The key opened up on the node: the re-run's one read of the TLS files sees it, and the copy puts it back.
    controller.ssh(NODE, OCTET, "sudo chmod 0644 /etc/llmgw/tls/node.key")
    fixed = controller.play("add_node", NODE, OCTET, **options)
    assert not fixed.failed, fixed.failure_messages()
    assert changed_everywhere(fixed) == 1, changed_tasks(fixed)
    assert controller.ssh(NODE, OCTET, "sudo stat -c %a /etc/llmgw/tls/node.key").strip() == "600"

    # A re-run still catches what changed under a ready node: libgomp gone (its package still says installed) makes
    # the digest differ, so every check runs again and the node is refused; put back exactly, the record holds again.
    real = controller.ssh(NODE, OCTET, "readlink -f %s" % LIBGOMP).strip()
    controller.ssh(NODE, OCTET, "sudo mv %s /root/libgomp.saved" % real)
    broken = controller.play("add_node", NODE, OCTET, **options)
    (asked,) = task_results(broken, ASK)
    assert asked["current"] is False and asked["changed_parts"] == ["libraries"], asked
    assert_refused_not_ready(controller, broken, NODE, "on-add cannot serve with this engine",
                             "libgomp.so.1 is not installed", "apt-get install libgomp1")
    controller.ssh(NODE, OCTET, "sudo mv /root/libgomp.saved %s" % real)
    restored = controller.play("add_node", NODE, OCTET, **options)
    assert not restored.failed, restored.failure_messages()
    (asked,) = task_results(restored, ASK)
    assert asked["current"] is True, asked
    assert controller.record(NODE)["state"] == "ready"
