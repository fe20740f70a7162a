"""wait_for_node's own helpers: reading PVE's ``agent`` property, and the ssh command line each attempt runs."""

import os

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils import vm_plan
from ansible_collections.llmgw.fleet.plugins.modules import wait_for_node

PARAMS = {"name": "node05", "port": 2222, "private_key_file": "/keys/fleet", "user": "debian"}


@pytest.mark.parametrize("value, enabled", [
    ("1", True),
    (1, True),
    ("enabled=1,fstrim_cloned_disks=1", True),
    ("fstrim_cloned_disks=1,enabled=1", True),
    ("1,type=virtio", True),
    ("yes", True),
    ("on", True),
    ("enabled=true,fstrim_cloned_disks=1", True),
    ("enabled=no", False),
    ("0", False),
    ("enabled=0,fstrim_cloned_disks=1", False),
    ("fstrim_cloned_disks=1", False),
    ("", False),
    (None, False),
])
def test_agent_enabled_reads_the_property_string(value, enabled):
    """wait_for_node reads the property as pve_vm's plan does: one function (it answered False for yes/on/true)."""
    assert wait_for_node.agent_enabled is vm_plan.agent_enabled
    assert wait_for_node.agent_enabled(value) is enabled


def options_of(argv):
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "-o"]


def test_ssh_files_the_key_under_the_node_name_and_never_prompts():
    argv = wait_for_node.ssh_argv(PARAMS, "10.77.0.105", "/fleet/known_hosts", True, "hostname")
    assert argv[:5] == ["ssh", "-p", "2222", "-i", "/keys/fleet"]
    assert argv[-2:] == ["debian@10.77.0.105", "hostname"]
    assert {"BatchMode=yes", "HostKeyAlias=node05", "UserKnownHostsFile=/fleet/known_hosts",
            "StrictHostKeyChecking=yes"} <= set(options_of(argv))


def test_ssh_before_the_key_is_known_checks_nothing():
    argv = wait_for_node.ssh_argv(PARAMS, "10.77.0.105", "/dev/null", False, "cloud-init status")
    assert "StrictHostKeyChecking=no" in options_of(argv) and "StrictHostKeyChecking=yes" not in options_of(argv)


KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"


class Failed(Exception):
    pass


class FakeWait:
    """What record_key uses of a Wait: the node's name, the module's atomic_move, and fail."""

    def __init__(self, name):
        self.name = name
        self.module = self

    @staticmethod
    def atomic_move(src, dest):
        os.replace(src, dest)

    def fail(self, msg):
        raise Failed(msg)


def test_two_nodes_added_at_once_both_keep_their_entry(tmp_path):
    path = str(tmp_path / "known_hosts")
    # Both runs read the empty file before waiting; the second to write must not drop the first one's entry.
    assert wait_for_node.record_key(FakeWait("node05"), path, "", "node05 " + KEY_A + "\n")
    assert wait_for_node.record_key(FakeWait("node06"), path, "", "node06 " + KEY_B + "\n")
    with open(path) as handle:
        lines = sorted(handle.read().splitlines())
    assert lines == ["node05 " + KEY_A, "node06 " + KEY_B]


def test_a_node_whose_entry_another_run_changed_meanwhile_is_refused(tmp_path):
    path = str(tmp_path / "known_hosts")
    wait_for_node.record_key(FakeWait("node05"), path, "", "node05 " + KEY_A + "\n")
    with pytest.raises(Failed, match="changed by another run"):
        wait_for_node.record_key(FakeWait("node05"), path, "", "node05 " + KEY_B + "\n")
    with open(path) as handle:
        assert handle.read() == "node05 " + KEY_A + "\n"


def test_an_unchanged_file_is_not_written(tmp_path):
    path = tmp_path / "known_hosts"
    path.write_text("node05 " + KEY_A + "\n")
    assert not wait_for_node.record_key(FakeWait("node05"), str(path), path.read_text(), path.read_text())
