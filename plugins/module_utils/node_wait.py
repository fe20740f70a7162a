# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What ``llmgw.fleet.wait_for_node`` does, between the module (parameters, messages) and the node.

It waits through a new VM's first boot (through the guest agent, then ssh; or over ssh alone) and settles the
node's host key in the fleet's known_hosts: an unknown key is learned, a known one must match, a changed one is
refused. ssh and ssh-keyscan are run through an injected ``run_command``, time is read and spent through
``clock`` and ``sleep``, and the guest agent is reached through the Proxmox client, so that all of it can be
driven without a network. Every way the wait can end badly is a typed error (or a ``proxmox_errors`` one from
finding the VM); only the module turns them into ``fail_json``.

The parts, each private (this module is the one callers import, and re-exports their public names):
:mod:`_node_wait_request` (the typed errors, the request, the ssh and ssh-keyscan command lines),
:mod:`_node_wait_known_hosts` (the fleet's known_hosts file: read, predicted, recorded under a lock); the guest
agent and the waiter are here.
"""

from __future__ import annotations

import os
import time

from ansible_collections.llmgw.fleet.plugins.module_utils import first_boot, host_keys
from ansible_collections.llmgw.fleet.plugins.module_utils._node_wait_known_hosts import (
    known_before_wait,
    predict,
    read_text,
    record_key,
    write_text,
)
from ansible_collections.llmgw.fleet.plugins.module_utils._node_wait_request import (
    HOST_KEY_SOURCES,
    AgentRefused,
    AgentUnavailable,
    BadPinnedKey,
    CloudInitFailed,
    HostKeyRefused,
    HostKeyUnreadable,
    KnownHostsConflict,
    NodeWaitError,
    NotReady,
    NotTheNode,
    VMNotIdentified,
    WaitFailed,
    WaitRequest,
    keyscan_argv,
    ssh_argv,
)
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_client import (
    HAS_PROXMOXER,
    ProxmoxClient,
    settings_from_params,
)
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import (
    AgentNotConfigured,
    AgentNotRunning,
    PermissionDenied,
    ProxmoxError,
    Timeout,
    VMNotRunning,
)
from ansible_collections.llmgw.fleet.plugins.module_utils.vm_plan import agent_enabled

__all__ = ["HOST_KEY_FILE", "HOST_KEY_SOURCES", "POLL_S", "AgentRefused", "AgentUnavailable", "BadPinnedKey",
           "CloudInitFailed", "GuestAgent", "HostKeyRefused", "HostKeyUnreadable", "KnownHostsConflict",
           "NodeWaitError", "NodeWaiter", "NotReady", "NotTheNode", "VMNotIdentified", "WaitFailed", "WaitRequest",
           "keyscan_argv", "known_before_wait", "open_agent", "predict", "read_text", "record_key", "ssh_argv",
           "vm_to_ask", "write_text"]

HOST_KEY_FILE = "/etc/ssh/ssh_host_ed25519_key.pub"
POLL_S = 2


# --------------------------------------------------------------------------------------------- guest agent


class GuestAgent:
    """The node's QEMU guest agent, reached through the Proxmox VE API."""

    def __init__(self, client, node, vmid):
        self.client = client
        self.node = node
        self.vmid = vmid

    def run(self, argv):
        return self.client.agent_exec(self.node, self.vmid, argv, timeout=30)

    def host_key(self):
        return host_keys.public_key(self.client.agent_read_file(self.node, self.vmid, HOST_KEY_FILE))


def vm_to_ask(client, request):
    """The VM whose agent is asked: by ``vmid`` when given, else by name; None where V(auto) finds none by name."""
    wanted = request.host_key_source == "agent"
    found = client.find_vms(vmid=request.vmid) if request.vmid is not None else client.find_vms(name=request.name)
    matches = [vm for vm in found if not vm["template"]]
    if not matches and not wanted and request.vmid is None:
        return None
    if len(matches) != 1:
        listed = ", ".join("{} ({})".format(vm.get("name"), vm["vmid"]) for vm in matches) or "none"
        wanted_vm = request.vmid or "named " + request.name
        raise VMNotIdentified("{}: cannot tell which VM to ask through the guest agent (VM {}: {}); give vmid, or "
                              "host_key_source=ssh".format(request.name, wanted_vm, listed))
    vm = matches[0]
    if vm.get("name") != request.name:
        raise VMNotIdentified("VM {} is called {}, not {}: wrong vmid?".format(
            vm["vmid"], vm.get("name"), request.name))
    return vm


def open_agent(request, connection, environ=None, connect=ProxmoxClient.connect, has_proxmoxer=HAS_PROXMOXER):
    """(GuestAgent, None), or (None, why not) where V(auto) is to use ssh; AgentUnavailable where V(agent) cannot
    be had. ``connection``: the Proxmox connection options (module parameters). A ProxmoxError of finding the VM
    is raised as it is."""
    wanted = request.host_key_source == "agent"
    if not has_proxmoxer:
        if wanted:
            raise AgentUnavailable("host_key_source=agent needs proxmoxer (pip install proxmoxer requests)")
        return None, "proxmoxer is not installed"
    try:
        settings = settings_from_params(connection, environ)
    except ProxmoxError as exc:
        if wanted:
            raise AgentUnavailable("host_key_source=agent needs the Proxmox connection options: {}".format(exc))
        return None, "no Proxmox connection options"
    client = connect(settings)
    vm = vm_to_ask(client, request)
    if vm is None:
        return None, "no VM named {} in the cluster".format(request.name)
    config = client.vm_config(vm["node"], vm["vmid"])
    if not agent_enabled(config.get("agent")):
        if wanted:
            raise AgentUnavailable("{} (VM {}) has no guest agent configured (agent: 1): use host_key_source=ssh, "
                                   "or enable the agent".format(request.name, vm["vmid"]))
        return None, "the VM's config does not enable the guest agent"
    return GuestAgent(client, vm["node"], vm["vmid"]), None


# ---------------------------------------------------------------------------------------------------- waiter


class NodeWaiter:
    """One wait for one node: its deadline, its timeline, and the steps from first boot to a settled key.

    ``run_command(argv)`` returns ``(rc, stdout, stderr)`` (the module's run_command); ``tmpdir`` holds the
    known_hosts files the ssh connections use; ``warn(message)`` is given a warning at once, so that it is also
    shown when the wait fails later; ``atomic_move`` puts the fleet's file in place."""

    def __init__(self, request, run_command, tmpdir, warn, clock=time.monotonic, sleep=time.sleep,
                 atomic_move=os.replace, poll_s=POLL_S):
        self.req = request
        self._run_command = run_command
        self._tmpdir = tmpdir
        self._warn = warn
        self._clock = clock
        self._sleep = sleep
        self._atomic_move = atomic_move
        self._poll_s = poll_s
        self.timeline = first_boot.Timeline()
        self.started = None
        self.deadline = None

    def run(self, open_agent):
        """The module's result once the node is ready and its key settled. ``open_agent()`` is called where the
        agent may be used (see ``open_agent``). WaitFailed, with the timeline, when the wait fails."""
        try:
            return self._run(open_agent)
        except WaitFailed as exc:
            exc.timeline = self.timeline.events
            raise

    def _run(self, open_agent):
        req = self.req
        original, known = known_before_wait(req)
        self.started = self._clock()
        self.deadline = self.started + req.timeout
        key, source, agent, why_not = None, "ssh", None, None
        if req.pinned_host_key:
            try:
                key, source = host_keys.public_key(req.pinned_host_key, keytype=None), "pinned"
            except host_keys.BadPublicKey as exc:
                raise BadPinnedKey("pinned_host_key: {}".format(exc))
        elif req.host_key_source != "ssh":
            agent, why_not = open_agent()
            if agent is not None:
                key = self.key_through_agent(agent, req.agent_wait if req.host_key_source == "auto" else None)
                if key is None:
                    why_not = "the guest agent could not be used: " + self.timeline.last["state"]
                    self._warn(self._fallback_warning())
                else:
                    source = "agent"
        if key is not None:
            self.settle(known, key)  # a changed key is refused before any ssh connection
            key = self.ready_with_pinned_key(known, key, agent if source == "agent" else None)
        else:
            key = self.ready_over_ssh()
        waited = self.elapsed()
        action = self.settle(known, key)
        updated = host_keys.add_entry(known, req.name, key) if action == host_keys.LEARN else known
        # The fleet's file is written only once the node proved, over strict ssh, that it is the one named.
        self.verify_identity(updated)
        changed = record_key(req.name, req.known_hosts_file, original, updated, self._atomic_move)
        return dict(changed=changed, host_key_action=action, host_key_source=source,
                    host_key_source_reason=why_not or "", host_key_fingerprint=host_keys.fingerprint(key),
                    waited_s=round(waited, 1), timeline=self.timeline.events)

    # ------------------------------------------------------------------------------------------- pieces

    def elapsed(self):
        return self._clock() - self.started

    def record(self, state, detail=""):
        self.timeline.record(self.elapsed(), state, detail)

    def pause(self):
        """NotReady, naming what was seen last, once the deadline has passed; else sleep until the next try."""
        if self._clock() >= self.deadline:
            last = self.timeline.last
            raise NotReady(first_boot.timeout_message(self.req.name, self.req.address, self.req.timeout, last), last)
        self._sleep(self._poll_s)

    def ssh(self, known_hosts, strict, command):
        return self._run_command(ssh_argv(self.req, known_hosts, strict, command))

    def _fallback_warning(self):
        last = self.timeline.last
        return ("{}: the guest agent could not be used within {} s (last seen: {}{}); the host key is learned over "
                "ssh after cloud-init instead".format(self.req.name, self.req.agent_wait, last["state"],
                                                      " ({})".format(last["detail"]) if last["detail"] else ""))

    def settle(self, known, key):
        """LEARN or KEEP for ``key``; HostKeyRefused, with both fingerprints, the node and the fix, on a change."""
        try:
            return host_keys.decide(known, self.req.name, key, self.req.known_hosts_file)
        except host_keys.HostKeyChanged as exc:
            raise HostKeyRefused(str(exc), exc.known_fingerprint, exc.offered_fingerprint)

    def key_through_agent(self, agent, give_up_after):
        """The host key read through the agent once cloud-init is done; None when the agent has not answered once
        within ``give_up_after`` seconds, or the API refuses its use (V(auto) then uses ssh)."""
        name = self.req.name
        answered = False
        while True:
            try:
                result = agent.run(["cloud-init", "status"])
                answered = True
                state = first_boot.classify_agent_status(result["exitcode"], result["out"])
                self.record(state, result["out"] if state == first_boot.UNKNOWN else "")
                if state == first_boot.AGENT_READY:
                    return agent.host_key()
                if state == first_boot.CLOUD_INIT_ERROR:
                    long_status = agent.run(["cloud-init", "status", "--long"])["out"]
                    raise CloudInitFailed("{}: cloud-init finished with an error: {}".format(name, long_status.strip()))
            except AgentNotConfigured as exc:
                raise AgentRefused("{}: {}".format(name, exc))
            except PermissionDenied as exc:
                self.record(first_boot.AGENT_FAILED, str(exc))
                if give_up_after is not None:
                    return None  # the token may not use the agent: waiting would not change that
                raise AgentRefused("{}: the API token or user may not use the guest agent: {}".format(name, exc))
            except VMNotRunning:
                self.record(first_boot.VM_NOT_RUNNING)
            except AgentNotRunning:
                self.record(first_boot.AGENT_NOT_ANSWERING)
            except (ProxmoxError, host_keys.BadPublicKey) as exc:
                answered = answered or isinstance(exc, (Timeout, host_keys.BadPublicKey))
                self.record(first_boot.AGENT_FAILED, str(exc))
            if not answered and give_up_after is not None and self.elapsed() >= give_up_after:
                return None
            self.pause()

    def ready_with_pinned_key(self, known, key, agent):
        """Waits until ssh, requiring ``key`` from the first connection on, says cloud-init is done; returns the key
        (re-read through the agent if the node changed it meanwhile)."""
        pinned_file = os.path.join(self._tmpdir, "pinned_known_hosts")
        while True:
            with open(pinned_file, "w") as handle:
                handle.write(host_keys.known_hosts_line(self.req.name, key))
            rc, out, err = self.ssh(pinned_file, True, "cloud-init status")
            state = first_boot.classify(rc, out, err)
            self.record(state, first_boot.detail(state, rc, out, err))
            if state == first_boot.READY:
                return key
            if state == first_boot.CLOUD_INIT_ERROR:
                raise CloudInitFailed("{}: cloud-init finished with an error: {}".format(self.req.name, out.strip()))
            if state == first_boot.KEY_CHANGED and agent is not None:
                try:
                    fresh = agent.host_key()
                except (ProxmoxError, host_keys.BadPublicKey) as exc:
                    self.record(first_boot.AGENT_FAILED, str(exc))
                else:
                    if fresh != key:
                        key = fresh
                        self.settle(known, key)
            self.pause()

    def ready_over_ssh(self):
        """Waits until ``cloud-init status`` over ssh (key not checked, nothing learned) is done; returns the key
        the node then offers."""
        name = self.req.name
        while True:
            # Nothing is learned before cloud-init is done: the key offered now may be the one it is about to replace.
            rc, out, err = self.ssh(os.devnull, False, "cloud-init status")
            state = first_boot.classify(rc, out, err)
            self.record(state, first_boot.detail(state, rc, out, err))
            if state == first_boot.READY:
                break
            if state == first_boot.CLOUD_INIT_ERROR:
                long_out = self.ssh(os.devnull, False, "cloud-init status --long")[1]
                raise CloudInitFailed("{}: cloud-init finished with an error: {}".format(name, long_out.strip()))
            self.pause()
        rc, out, err = self._run_command(keyscan_argv(self.req))
        keys = [line.split(None, 1)[1] for line in out.splitlines() if line and not line.startswith("#")]
        if rc != 0 or not keys:
            raise HostKeyUnreadable("{}: could not read its host key with ssh-keyscan: {}".format(name, err))
        return keys[0]

    def verify_identity(self, updated):
        """Strict ssh against the fleet's file as it is to be written: the node holds the key and is called by its
        name. NotTheNode otherwise."""
        name = self.req.name
        candidate = os.path.join(self._tmpdir, "fleet_known_hosts")
        with open(candidate, "w") as handle:
            handle.write(updated)
        rc, out, err = self.ssh(candidate, True, "hostname")
        if rc != 0:
            raise NotTheNode(f"{name}: strict ssh with the fleet's known_hosts failed: {err.strip()}")
        if out.strip() != name:
            raise NotTheNode(f"the VM named {name} calls itself {out.strip()!r}: its hostname must be its name")
