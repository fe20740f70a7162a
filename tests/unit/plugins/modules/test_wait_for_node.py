"""wait_for_node's own helpers: reading PVE's ``agent`` property, and the ssh command line each attempt runs."""

import pytest

from ansible_collections.llmgw.fleet.plugins.modules import wait_for_node

PARAMS = {"name": "node05", "port": 2222, "private_key_file": "/keys/fleet", "user": "debian"}


@pytest.mark.parametrize("value, enabled", [
    ("1", True),
    (1, True),
    ("enabled=1,fstrim_cloned_disks=1", True),
    ("fstrim_cloned_disks=1,enabled=1", True),
    ("1,type=virtio", True),
    ("0", False),
    ("enabled=0,fstrim_cloned_disks=1", False),
    ("fstrim_cloned_disks=1", False),
    ("", False),
    (None, False),
])
def test_agent_enabled_reads_the_property_string(value, enabled):
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
