"""node_wait on a fake clock, a fake node (its sshd, cloud-init and host keys, as ssh and the guest agent see them)
and the fake Proxmox client: learning an unknown key, keeping a known one, refusing a changed one, the agent used,
not configured or not answering, and each typed error with what it says. The unit form of the wait_for_node parts
of tests/e2e/test_provision_node.py."""

import inspect
import re

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils import first_boot, host_keys, node_wait
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_client import ProxmoxClient
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import (
    AgentNotConfigured,
    PermissionDenied,
    ProxmoxError,
)
from ansible_collections.llmgw.fleet.tests.unit.plugins.module_utils.fake_node import (
    ADDRESS,
    AUTH_ERR,
    KEY_FINAL,
    KEY_IMAGE,
    KEY_OTHER,
    NAME,
    VMID,
    Clock,
    FakeNode,
    options_of,
    strict,
)
from ansible_collections.llmgw.fleet.tests.unit.plugins.module_utils.fake_pve_api import FakeProxmoxClient

CONNECTION = {"api_host": "pve.example.com", "api_token_id": "ansible@pve!fleet", "api_token_secret": "secret"}


class Run:
    """One wait_for_node run on the fake node: the request, the waiter and what it warned."""

    def __init__(self, tmp_path, node, cluster=None, **options):
        args = dict(name=NAME, address=ADDRESS + "/24", private_key_file="/keys/fleet",
                    known_hosts_file=str(tmp_path / "fleet" / "known_hosts"), timeout=60, agent_wait=20)
        args.update(options)
        self.request = node_wait.WaitRequest(**args)
        self.path = tmp_path / "fleet" / "known_hosts"
        self.node = node
        self.cluster = cluster
        self.warnings = []
        self.connected = []
        tmpdir = tmp_path / "tmp"
        tmpdir.mkdir(exist_ok=True)
        self.waiter = node_wait.NodeWaiter(self.request, node.run_command, str(tmpdir), self.warnings.append,
                                           clock=node.clock, sleep=node.clock.sleep)

    def connect(self, settings):
        self.connected.append(settings)
        return self.cluster

    def open_agent(self, connection=None, has_proxmoxer=True):
        return node_wait.open_agent(self.request, CONNECTION if connection is None else connection, {},
                                    connect=self.connect, has_proxmoxer=has_proxmoxer)

    def __call__(self):
        return self.waiter.run(self.open_agent)

    def known(self):
        return self.path.read_text() if self.path.exists() else None

    def states(self):
        return [event["state"] for event in self.waiter.timeline.events]


def cluster_with(node, agent="1", status="running", name=NAME, vmid=VMID):
    cluster = FakeProxmoxClient()
    cluster.add_vm(vmid, name, config={"agent": agent}, status=status)
    cluster.add_guest(vmid, node)
    return cluster


def hostile_first_boot(clock, **extra):
    """sshd refuses, then the login key is not there yet, then cloud-init runs and replaces the host key."""
    args = dict(sshd=((0, "refused"), (4, "auth"), (8, "up")), cloud_init=((0, "running"), (12, "done")),
                keys=((0, KEY_IMAGE), (10, KEY_FINAL)))
    args.update(extra)
    return FakeNode(clock, **args)


# ---- over ssh ------------------------------------------------------------------------------------------------------


def test_over_ssh_an_unknown_key_is_learned_only_once_cloud_init_is_done(tmp_path):
    node = hostile_first_boot(Clock())
    run = Run(tmp_path, node, host_key_source="ssh")
    result = run()
    assert (result["changed"], result["host_key_action"], result["host_key_source"]) == (True, "learn", "ssh")
    assert result["host_key_source_reason"] == ""
    assert result["host_key_fingerprint"] == host_keys.fingerprint(KEY_FINAL)
    assert run.known() == "%s %s\n" % (NAME, KEY_FINAL)
    assert run.states() == [first_boot.REFUSED, first_boot.AUTH_FAILED, first_boot.CLOUD_INIT_RUNNING,
                            first_boot.READY]
    assert [event["after_s"] for event in result["timeline"]] == [0.0, 4.0, 8.0, 12.0]
    assert result["waited_s"] == 12.0 and set(node.clock.slept) == {node_wait.POLL_S}
    # Before cloud-init was done nothing was checked or learned; the one strict connection checked the final key.
    waiting, final = node.ssh_commands()[:-1], node.ssh_commands()[-1]
    assert all("UserKnownHostsFile=/dev/null" in options_of(argv) and not strict(argv) for argv in waiting)
    assert strict(final) and final[-1] == "hostname"
    assert [argv[0] for argv in node.commands].count("ssh-keyscan") == 1


def test_over_ssh_a_known_key_is_kept_and_the_file_left_alone(tmp_path):
    node = FakeNode(Clock())
    run = Run(tmp_path, node, host_key_source="ssh")
    run.path.parent.mkdir()
    run.path.write_text("node06 %s\n%s %s\n" % (KEY_OTHER, NAME, KEY_FINAL))
    before = run.path.stat().st_mtime_ns
    result = run()
    assert (result["changed"], result["host_key_action"]) == (False, "keep")
    assert run.known() == "node06 %s\n%s %s\n" % (KEY_OTHER, NAME, KEY_FINAL)
    assert run.path.stat().st_mtime_ns == before


def test_over_ssh_a_changed_key_is_refused_with_both_fingerprints_and_the_fix(tmp_path):
    node = hostile_first_boot(Clock())
    run = Run(tmp_path, node, host_key_source="ssh")
    run.path.parent.mkdir()
    run.path.write_text("%s %s\n" % (NAME, KEY_OTHER))
    with pytest.raises(node_wait.HostKeyRefused) as caught:
        run()
    refused = caught.value
    assert (refused.known_fingerprint, refused.offered_fingerprint) == (host_keys.fingerprint(KEY_OTHER),
                                                                        host_keys.fingerprint(KEY_FINAL))
    for part in (NAME, refused.known_fingerprint, refused.offered_fingerprint,
                 "ssh-keygen -R %s -f %s" % (NAME, run.path), "rebuild=true"):
        assert part in str(refused), part
    assert refused.timeline[-1]["state"] == first_boot.READY
    assert run.known() == "%s %s\n" % (NAME, KEY_OTHER)
    assert not any(strict(argv) for argv in node.ssh_commands())


def test_forget_known_key_learns_the_rebuilt_node_s_key_and_keeps_the_others(tmp_path):
    node = FakeNode(Clock())
    run = Run(tmp_path, node, host_key_source="ssh", forget_known_key=True)
    run.path.parent.mkdir()
    run.path.write_text("%s %s\nnode06 %s\n" % (NAME, KEY_OTHER, KEY_IMAGE))
    result = run()
    assert (result["changed"], result["host_key_action"]) == (True, "learn")
    assert run.known() == "node06 %s\n%s %s\n" % (KEY_IMAGE, NAME, KEY_FINAL)


def test_timeout_names_the_node_and_what_it_saw_last(tmp_path):
    node = FakeNode(Clock(), sshd=((0, "refused"), (6, "auth")))
    run = Run(tmp_path, node, host_key_source="ssh", timeout=10)
    with pytest.raises(node_wait.NotReady) as caught:
        run()
    assert str(caught.value) == ("%s (%s) was not ready after 10 s; last seen: %s (%s)"
                                 % (NAME, ADDRESS, first_boot.AUTH_FAILED, AUTH_ERR.strip()))
    assert caught.value.last["state"] == first_boot.AUTH_FAILED
    assert [e["state"] for e in caught.value.timeline] == [first_boot.REFUSED, first_boot.AUTH_FAILED]
    assert node.clock() == 10 and run.known() is None


def test_cloud_init_error_over_ssh_says_its_long_status(tmp_path):
    node = FakeNode(Clock(), cloud_init=((0, "running"), (4, "error")))
    with pytest.raises(node_wait.CloudInitFailed) as caught:
        Run(tmp_path, node, host_key_source="ssh")()
    assert str(caught.value).startswith("%s: cloud-init finished with an error: status: error" % NAME)
    assert "modules-final failed" in str(caught.value)
    assert caught.value.timeline[-1]["state"] == first_boot.CLOUD_INIT_ERROR


def test_a_key_ssh_keyscan_cannot_read_is_an_error(tmp_path):
    with pytest.raises(node_wait.HostKeyUnreadable, match="node05: could not read its host key with ssh-keyscan: "
                                                          "10.77.0.105: Connection closed"):
        Run(tmp_path, FakeNode(Clock(), keyscan=False), host_key_source="ssh")()


def test_a_node_calling_itself_otherwise_is_refused_and_nothing_is_written(tmp_path):
    run = Run(tmp_path, FakeNode(Clock(), hostname="debian"), host_key_source="ssh")
    with pytest.raises(node_wait.NotTheNode) as caught:
        run()
    assert str(caught.value) == "the VM named node05 calls itself 'debian': its hostname must be its name"
    assert run.known() is None


def test_an_entry_another_run_wrote_meanwhile_is_not_overwritten(tmp_path):
    node = FakeNode(Clock(), cloud_init=((0, "running"), (4, "done")))
    run = Run(tmp_path, node, host_key_source="ssh")
    run.path.parent.mkdir()

    def meanwhile(argv):
        if not run.path.exists():
            run.path.write_text("%s %s\n" % (NAME, KEY_OTHER))  # another run settled this node first
        return FakeNode.run_command(node, argv)

    run.waiter._run_command = meanwhile
    with pytest.raises(node_wait.KnownHostsConflict, match="its entry in .* was changed by another run") as caught:
        run()
    assert caught.value.timeline[-1]["state"] == first_boot.READY
    assert run.known() == "%s %s\n" % (NAME, KEY_OTHER)


# ---- through the guest agent ---------------------------------------------------------------------------------------


def test_agent_pins_the_final_key_before_the_first_ssh_connection(tmp_path):
    clock = Clock()
    node = hostile_first_boot(clock, agent_from=2)
    cluster = cluster_with(node)
    run = Run(tmp_path, node, cluster)
    result = run()
    assert (result["host_key_source"], result["host_key_action"], result["changed"]) == ("agent", "learn", True)
    assert result["host_key_fingerprint"] == host_keys.fingerprint(KEY_FINAL)
    assert run.known() == "%s %s\n" % (NAME, KEY_FINAL)
    states = run.states()
    assert states[:3] == [first_boot.AGENT_NOT_ANSWERING, first_boot.AGENT_CLOUD_INIT_RUNNING, first_boot.AGENT_READY]
    assert states[3:] == [first_boot.READY]  # by then sshd was up with the key the agent read
    # Every ssh connection required the key read through the hypervisor; ssh-keyscan was never needed.
    assert node.ssh_commands() and all(strict(argv) for argv in node.ssh_commands())
    assert "ssh-keyscan" not in [argv[0] for argv in node.commands]
    assert [settings.host for settings in run.connected] == ["pve.example.com"]
    agent_calls = [call for call in cluster.calls if call.method.startswith("agent_")]
    assert {(call.args["node"], call.args["vmid"]) for call in agent_calls} == {("pve", VMID)}


def test_agent_a_changed_key_is_refused_before_any_ssh_connection(tmp_path):
    node = FakeNode(Clock())
    run = Run(tmp_path, node, cluster_with(node))
    run.path.parent.mkdir()
    run.path.write_text("%s %s\n" % (NAME, KEY_OTHER))
    with pytest.raises(node_wait.HostKeyRefused) as caught:
        run()
    assert caught.value.offered_fingerprint == host_keys.fingerprint(KEY_FINAL)
    assert node.commands == []
    assert run.known() == "%s %s\n" % (NAME, KEY_OTHER)


def test_agent_a_key_replaced_after_it_was_read_is_read_again(tmp_path):
    """cloud-init said done through the agent, then the key changed before sshd came up: ssh meets another key
    than the pinned one, the agent reads it again, and the new key is the one learned."""
    node = FakeNode(Clock(), sshd=((0, "refused"), (2, "up")), keys=((0, KEY_IMAGE), (1, KEY_FINAL)))
    run = Run(tmp_path, node, cluster_with(node))
    result = run()
    assert run.states() == [first_boot.AGENT_READY, first_boot.REFUSED, first_boot.KEY_CHANGED, first_boot.READY]
    assert result["host_key_fingerprint"] == host_keys.fingerprint(KEY_FINAL)
    assert run.known() == "%s %s\n" % (NAME, KEY_FINAL)


def test_agent_not_configured_auto_uses_ssh_and_says_why(tmp_path):
    node = FakeNode(Clock())
    cluster = cluster_with(node, agent="enabled=0")
    run = Run(tmp_path, node, cluster)
    result = run()
    assert (result["host_key_source"], result["host_key_action"]) == ("ssh", "learn")
    assert result["host_key_source_reason"] == "the VM's config does not enable the guest agent"
    assert not any(call.method.startswith("agent_") for call in cluster.calls)
    assert "ssh-keyscan" in [argv[0] for argv in node.commands] and run.warnings == []


def test_agent_not_configured_with_host_key_source_agent_is_refused(tmp_path):
    node = FakeNode(Clock())
    run = Run(tmp_path, node, cluster_with(node, agent="0"), host_key_source="agent")
    with pytest.raises(node_wait.AgentUnavailable) as caught:
        run()
    assert str(caught.value) == ("node05 (VM 1105) has no guest agent configured (agent: 1): use "
                                 "host_key_source=ssh, or enable the agent")
    assert not isinstance(caught.value, node_wait.WaitFailed) and node.commands == []


def test_agent_that_never_answers_auto_falls_back_to_ssh_with_a_warning(tmp_path):
    clock = Clock()
    node = FakeNode(clock, agent_from=1000)
    run = Run(tmp_path, node, cluster_with(node), agent_wait=6)
    result = run()
    assert (result["host_key_source"], result["host_key_action"]) == ("ssh", "learn")
    assert result["host_key_source_reason"] == "the guest agent could not be used: " + first_boot.AGENT_NOT_ANSWERING
    assert run.warnings == ["node05: the guest agent could not be used within 6 s (last seen: %s); the host key is "
                            "learned over ssh after cloud-init instead" % first_boot.AGENT_NOT_ANSWERING]
    assert run.states() == [first_boot.AGENT_NOT_ANSWERING, first_boot.READY]
    assert run.waiter.timeline.events[1]["after_s"] == 6.0


def test_agent_that_answered_is_waited_for_past_agent_wait(tmp_path):
    """agent_wait bounds the wait for a first answer only: cloud-init may run longer; an answer V(cloud-init) does
    not know is kept in the timeline with what it said."""
    node = FakeNode(Clock(), cloud_init=((0, "running"), (4, "booting"), (30, "done")))
    run = Run(tmp_path, node, cluster_with(node), agent_wait=6)
    result = run()
    assert (result["host_key_source"], result["host_key_source_reason"], run.warnings) == ("agent", "", [])
    assert [(e["after_s"], e["state"], e["detail"]) for e in result["timeline"]] == [
        (0.0, first_boot.AGENT_CLOUD_INIT_RUNNING, ""), (4.0, first_boot.UNKNOWN, "status: booting"),
        (30.0, first_boot.AGENT_READY, ""), (30.0, first_boot.READY, "status: done")]


def test_agent_that_never_answers_with_host_key_source_agent_times_out_saying_so(tmp_path):
    node = FakeNode(Clock(), agent_from=1000)
    with pytest.raises(node_wait.NotReady, match="was not ready after 10 s; last seen: the guest agent does not "
                                                 "answer yet") as caught:
        Run(tmp_path, node, cluster_with(node), host_key_source="agent", timeout=10)()
    assert caught.value.last["state"] == first_boot.AGENT_NOT_ANSWERING and node.commands == []


def test_a_stopped_vm_times_out_as_not_running(tmp_path):
    node = FakeNode(Clock())
    with pytest.raises(node_wait.NotReady) as caught:
        Run(tmp_path, node, cluster_with(node, status="stopped"), host_key_source="agent", timeout=4)()
    assert str(caught.value) == "node05 (10.77.0.105) was not ready after 4 s; last seen: " + first_boot.VM_NOT_RUNNING


def test_permission_denied_auto_falls_back_at_once_agent_is_refused(tmp_path):
    denied = "HTTP 403: Permission check failed (/vms/1105, VM.Monitor)"
    node = FakeNode(Clock())
    cluster = cluster_with(node)
    cluster.fail("agent_exec", PermissionDenied(denied, status=403))
    run = Run(tmp_path, node, cluster)
    result = run()
    assert result["host_key_source"] == "ssh" and node.clock.slept == []
    assert result["host_key_source_reason"] == "the guest agent could not be used: " + first_boot.AGENT_FAILED
    assert run.warnings and "(last seen: %s (%s))" % (first_boot.AGENT_FAILED, denied) in run.warnings[0]

    node = FakeNode(Clock())
    cluster = cluster_with(node)
    cluster.fail("agent_exec", PermissionDenied(denied, status=403))
    with pytest.raises(node_wait.AgentRefused) as caught:
        Run(tmp_path, node, cluster, host_key_source="agent")()
    assert str(caught.value) == "node05: the API token or user may not use the guest agent: " + denied
    assert caught.value.timeline == [{"after_s": 0.0, "state": first_boot.AGENT_FAILED, "detail": denied}]


def test_pve_saying_the_agent_is_not_configured_after_all_is_refused(tmp_path):
    node = FakeNode(Clock())
    cluster = cluster_with(node)
    cluster.fail("agent_exec", AgentNotConfigured("HTTP 500: No QEMU guest agent configured", status=500))
    with pytest.raises(node_wait.AgentRefused, match="^node05: HTTP 500: No QEMU guest agent configured$"):
        Run(tmp_path, node, cluster)()


def test_cloud_init_error_through_the_agent_says_its_long_status(tmp_path):
    node = FakeNode(Clock(), cloud_init=((0, "running"), (2, "error")))
    with pytest.raises(node_wait.CloudInitFailed, match="^node05: cloud-init finished with an error: status: error"):
        Run(tmp_path, node, cluster_with(node))()
    assert node.commands == []


# ---- finding the VM and the agent ----------------------------------------------------------------------------------


def test_no_vm_of_that_name_auto_uses_ssh_agent_is_refused(tmp_path):
    node = FakeNode(Clock())
    cluster = cluster_with(node, name="node06", vmid=1106)
    assert Run(tmp_path, node, cluster).open_agent() == (None, "no VM named node05 in the cluster")
    with pytest.raises(node_wait.VMNotIdentified) as caught:
        Run(tmp_path, node, cluster, host_key_source="agent").open_agent()
    assert str(caught.value) == ("node05: cannot tell which VM to ask through the guest agent (VM named node05: "
                                 "none); give vmid, or host_key_source=ssh")


def test_several_vms_of_that_name_are_refused_naming_them_templates_never_count(tmp_path):
    node = FakeNode(Clock())
    cluster = cluster_with(node)
    cluster.add_vm(1205, NAME, config={"agent": "1"}, status="running")
    cluster.add_template(9005, NAME)
    with pytest.raises(node_wait.VMNotIdentified, match=re.escape("(VM named node05: node05 (1105), node05 (1205))")):
        Run(tmp_path, node, cluster).open_agent()
    agent, why_not = Run(tmp_path, node, cluster, vmid=1205).open_agent()
    assert (agent.node, agent.vmid, why_not) == ("pve", 1205, None)


def test_a_vmid_naming_another_vm_is_refused(tmp_path):
    node = FakeNode(Clock())
    cluster = cluster_with(node, name="node06", vmid=1106)
    with pytest.raises(node_wait.VMNotIdentified, match="^VM 1106 is called node06, not node05: wrong vmid[?]$"):
        Run(tmp_path, node, cluster, vmid=1106).open_agent()
    with pytest.raises(node_wait.VMNotIdentified, match=re.escape("(VM 1107: none)")):
        Run(tmp_path, node, cluster, vmid=1107).open_agent()


def test_without_proxmoxer_or_connection_options_auto_uses_ssh_agent_is_refused(tmp_path):
    run = Run(tmp_path, FakeNode(Clock()))
    assert run.open_agent(has_proxmoxer=False) == (None, "proxmoxer is not installed")
    assert run.open_agent(connection={}) == (None, "no Proxmox connection options")
    assert run.connected == []
    agent = Run(tmp_path, FakeNode(Clock()), host_key_source="agent")
    with pytest.raises(node_wait.AgentUnavailable, match=r"^host_key_source=agent needs proxmoxer \(pip install"):
        agent.open_agent(has_proxmoxer=False)
    with pytest.raises(node_wait.AgentUnavailable, match="^host_key_source=agent needs the Proxmox connection "
                                                         "options: missing Proxmox connection parameters: api_host"):
        agent.open_agent(connection={})


def test_an_api_error_finding_the_vm_is_raised_typed_for_the_module(tmp_path):
    node = FakeNode(Clock())
    cluster = cluster_with(node)
    cluster.fail("guests", PermissionDenied("HTTP 403: Permission check failed (/, Sys.Audit)", status=403))
    run = Run(tmp_path, node, cluster)
    with pytest.raises(PermissionDenied, match="Sys.Audit"):
        run()
    assert node.commands == [] and run.known() is None


# ---- pinned keys, check mode ---------------------------------------------------------------------------------------


def test_a_pinned_key_is_required_from_the_first_connection_and_no_agent_is_asked(tmp_path):
    node = hostile_first_boot(Clock())
    run = Run(tmp_path, node, pinned_host_key=KEY_FINAL + " root@node05")
    result = run()
    assert (result["host_key_source"], result["host_key_action"]) == ("pinned", "learn")
    assert run.connected == [] and all(strict(argv) for argv in node.ssh_commands())
    # Until cloud-init replaced the image's key, ssh met a key other than the pinned one.
    assert first_boot.KEY_CHANGED in run.states() and run.states()[-1] == first_boot.READY


def test_a_bad_pinned_key_is_refused_before_waiting(tmp_path):
    for pinned, said in (("ssh-ed25519 AAAAnotakey", "not an ssh-ed25519 public key: 'ssh-ed25519 AAAAnotakey'"),
                         ("garbage", "not an OpenSSH public key: 'garbage'")):
        run = Run(tmp_path, FakeNode(Clock()), pinned_host_key=pinned)
        with pytest.raises(node_wait.BadPinnedKey) as caught:
            run()
        assert str(caught.value) == "pinned_host_key: " + said
        assert not isinstance(caught.value, node_wait.WaitFailed) and run.node.commands == []


def test_check_mode_predicts_from_the_file_alone(tmp_path):
    path = tmp_path / "known_hosts"
    request = node_wait.WaitRequest(NAME, ADDRESS, "/keys/fleet", str(path))
    assert node_wait.predict(request) == {"changed": True, "host_key_action": "learn", "timeline": []}
    path.write_text("%s %s\n" % (NAME, KEY_FINAL))
    assert node_wait.predict(request) == {"changed": False, "host_key_action": "keep", "timeline": []}
    request.forget_known_key = True
    assert node_wait.predict(request)["host_key_action"] == "learn"


def test_the_fake_has_every_client_method_node_wait_calls_with_the_same_signature():
    called = set(re.findall(r"client\.(\w+)\(", inspect.getsource(node_wait)))
    assert {"find_vms", "vm_config", "agent_exec", "agent_read_file"} <= called
    for method in sorted(called):
        real = inspect.signature(getattr(ProxmoxClient, method))
        assert inspect.signature(getattr(FakeProxmoxClient, method)) == real, method


def test_errors_before_the_wait_carry_no_timeline_and_every_error_is_a_node_wait_error():
    assert issubclass(node_wait.VMNotIdentified, node_wait.AgentUnavailable)
    for cls in (node_wait.BadPinnedKey, node_wait.AgentUnavailable):
        assert issubclass(cls, node_wait.NodeWaitError) and not issubclass(cls, node_wait.WaitFailed)
    for cls in (node_wait.NotReady, node_wait.CloudInitFailed, node_wait.AgentRefused, node_wait.HostKeyRefused,
                node_wait.HostKeyUnreadable, node_wait.NotTheNode, node_wait.KnownHostsConflict):
        assert issubclass(cls, node_wait.WaitFailed) and not issubclass(cls, ProxmoxError)
