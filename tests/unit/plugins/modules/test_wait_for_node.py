"""wait_for_node's helpers (in module_utils/node_wait.py): reading PVE's ``agent`` property, the ssh command line
each attempt runs, and writing the fleet's known_hosts; and the module itself, which turns node_wait's outcome and
errors into its result."""

import os

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.llmgw.fleet.plugins.module_utils import first_boot, host_keys, node_wait, vm_plan
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import PermissionDenied
from ansible_collections.llmgw.fleet.plugins.modules import wait_for_node
from ansible_collections.llmgw.fleet.tests.unit.plugins.module_utils.fake_node import (
    KEY_FINAL,
    KEY_OTHER,
    NAME,
    Clock,
    FakeNode,
)


def request(address="10.77.0.105"):
    return node_wait.WaitRequest(name="node05", address=address, port=2222, private_key_file="/keys/fleet",
                                 known_hosts_file="/fleet/known_hosts", user="debian")


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
    assert node_wait.agent_enabled is vm_plan.agent_enabled
    assert node_wait.agent_enabled(value) is enabled


def options_of(argv):
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "-o"]


def test_ssh_files_the_key_under_the_node_name_and_never_prompts():
    argv = node_wait.ssh_argv(request("10.77.0.105/24"), "/fleet/known_hosts", True, "hostname")
    assert argv[:5] == ["ssh", "-p", "2222", "-i", "/keys/fleet"]
    assert argv[-2:] == ["debian@10.77.0.105", "hostname"]
    assert {"BatchMode=yes", "HostKeyAlias=node05", "UserKnownHostsFile=/fleet/known_hosts",
            "StrictHostKeyChecking=yes"} <= set(options_of(argv))


def test_ssh_before_the_key_is_known_checks_nothing():
    argv = node_wait.ssh_argv(request(), "/dev/null", False, "cloud-init status")
    assert "StrictHostKeyChecking=no" in options_of(argv) and "StrictHostKeyChecking=yes" not in options_of(argv)


KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"


def test_two_nodes_added_at_once_both_keep_their_entry(tmp_path):
    path = str(tmp_path / "known_hosts")
    # Both runs read the empty file before waiting; the second to write must not drop the first one's entry.
    assert node_wait.record_key("node05", path, "", "node05 " + KEY_A + "\n", os.replace)
    assert node_wait.record_key("node06", path, "", "node06 " + KEY_B + "\n", os.replace)
    with open(path) as handle:
        lines = sorted(handle.read().splitlines())
    assert lines == ["node05 " + KEY_A, "node06 " + KEY_B]


def test_a_node_whose_entry_another_run_changed_meanwhile_is_refused(tmp_path):
    path = str(tmp_path / "known_hosts")
    node_wait.record_key("node05", path, "", "node05 " + KEY_A + "\n", os.replace)
    with pytest.raises(node_wait.KnownHostsConflict, match="changed by another run"):
        node_wait.record_key("node05", path, "", "node05 " + KEY_B + "\n", os.replace)
    with open(path) as handle:
        assert handle.read() == "node05 " + KEY_A + "\n"


def test_an_unchanged_file_is_not_written(tmp_path):
    path = tmp_path / "known_hosts"
    path.write_text("node05 " + KEY_A + "\n")
    assert not node_wait.record_key("node05", str(path), path.read_text(), path.read_text(), os.replace)


# ---- the module ----------------------------------------------------------------------------------------------------


class Exited(Exception):
    def __init__(self, result):
        super().__init__(result.get("msg", ""))
        self.result = result


def run_module(monkeypatch, tmp_path, node, **args):
    """main() with ``args``, ssh and ssh-keyscan answered by ``node``: what it returned (``failed`` for fail_json)."""

    def exit_json(module, **result):
        raise Exited(dict(result, failed=False))

    def fail_json(module, msg, **result):
        raise Exited(dict(result, msg=msg, failed=True))

    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda module, argv, **kw: node.run_command(argv))
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
    for variable in [name for name in os.environ if name.startswith("PROXMOX_")]:
        monkeypatch.delenv(variable)
    module_args = dict(name=NAME, address="10.77.0.105/24", private_key_file="/keys/fleet",
                       known_hosts_file=str(tmp_path / "known_hosts"), _ansible_remote_tmp=str(tmp_path))
    module_args.update(args)
    with patch_module_args(module_args), pytest.raises(Exited) as caught:
        wait_for_node.main()
    return caught.value.result


def test_module_returns_the_settled_key(monkeypatch, tmp_path):
    result = run_module(monkeypatch, tmp_path, FakeNode(Clock()))
    assert not result["failed"] and result["changed"]
    assert (result["host_key_action"], result["host_key_source"]) == ("learn", "ssh")
    assert result["host_key_source_reason"] == "no Proxmox connection options"
    assert result["host_key_fingerprint"] == host_keys.fingerprint(KEY_FINAL)
    assert [event["state"] for event in result["timeline"]] == [first_boot.READY]
    assert (tmp_path / "known_hosts").read_text() == "%s %s\n" % (NAME, KEY_FINAL)


def test_module_a_changed_key_fails_with_both_fingerprints_and_the_timeline(monkeypatch, tmp_path):
    (tmp_path / "known_hosts").write_text("%s %s\n" % (NAME, KEY_OTHER))
    result = run_module(monkeypatch, tmp_path, FakeNode(Clock()), host_key_source="ssh")
    assert result["failed"] and result["msg"].startswith("host key of node05 changed")
    assert (result["known_fingerprint"], result["offered_fingerprint"]) == (host_keys.fingerprint(KEY_OTHER),
                                                                            host_keys.fingerprint(KEY_FINAL))
    assert [event["state"] for event in result["timeline"]] == [first_boot.READY]


def test_module_a_timeout_fails_with_the_timeline_and_nothing_else(monkeypatch, tmp_path):
    result = run_module(monkeypatch, tmp_path, FakeNode(Clock(), sshd=((0, "refused"),)), host_key_source="ssh",
                        timeout=0)
    assert result["failed"] and result["msg"].startswith("node05 (10.77.0.105) was not ready after 0 s; last seen: ")
    assert [event["state"] for event in result["timeline"]] == [first_boot.REFUSED]
    assert set(result) == {"msg", "failed", "timeline"}


def test_module_an_error_before_the_wait_fails_without_a_timeline(monkeypatch, tmp_path):
    node = FakeNode(Clock())
    result = run_module(monkeypatch, tmp_path, node, pinned_host_key="garbage")
    assert result == {"msg": "pinned_host_key: not an OpenSSH public key: 'garbage'", "failed": True}
    assert node.commands == []


def test_module_an_api_error_finding_the_vm_names_the_node_and_the_error_type(monkeypatch, tmp_path):
    def open_agent(request, connection, environ):
        assert connection["api_host"] == "pve.example.com"
        raise PermissionDenied("HTTP 403: Permission check failed (/, Sys.Audit)", status=403)

    monkeypatch.setattr(wait_for_node, "open_agent", open_agent)
    result = run_module(monkeypatch, tmp_path, FakeNode(Clock()), api_host="pve.example.com",
                        api_token_id="ansible@pve!fleet", api_token_secret="secret")
    assert result == {"msg": "node05: reading its VM through the Proxmox API failed: HTTP 403: Permission check "
                             "failed (/, Sys.Audit)", "error": "PermissionDenied", "failed": True}


def test_module_check_mode_predicts_and_contacts_nothing(monkeypatch, tmp_path):
    node = FakeNode(Clock())
    result = run_module(monkeypatch, tmp_path, node, _ansible_check_mode=True)
    assert result == {"changed": True, "host_key_action": "learn", "timeline": [], "failed": False}
    assert node.commands == [] and not (tmp_path / "known_hosts").exists()
