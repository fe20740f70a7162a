# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What ``llmgw.fleet.wait_for_node`` does, between the module (parameters, messages) and the node.

It waits through a new VM's first boot (through the guest agent, then ssh; or over ssh alone) and settles the
node's host key in the fleet's known_hosts: an unknown key is learned, a known one must match, a changed one is
refused. ssh and ssh-keyscan are run through an injected ``run_command``, time is read and spent through
``clock`` and ``sleep``, and the guest agent is reached through the Proxmox client, so that all of it can be
driven without a network. Every way the wait can end badly is a typed error below (or a ``proxmox_errors`` one
from finding the VM); only the module turns them into ``fail_json``.
"""

from __future__ import annotations

import fcntl
import os
import time

from ansible_collections.llmgw.fleet.plugins.module_utils import first_boot, host_keys
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

HOST_KEY_FILE = "/etc/ssh/ssh_host_ed25519_key.pub"
POLL_S = 2
HOST_KEY_SOURCES = ("auto", "agent", "ssh")


# ---------------------------------------------------------------------------------------------------- errors


class NodeWaitError(Exception):
    """Base of this module's errors. Raised before the wait began (a bad pinned key, a guest agent that cannot be
    had): no timeline goes with them."""


class BadPinnedKey(NodeWaitError):
    """``pinned_host_key`` is not an OpenSSH public key."""


class AgentUnavailable(NodeWaitError):
    """``host_key_source=agent`` cannot be had: no proxmoxer, no connection options, no agent in the VM's config."""


class VMNotIdentified(AgentUnavailable):
    """No single VM of that name (or VMID) to ask through the guest agent, or the VMID names another VM."""


class WaitFailed(NodeWaitError):
    """The wait began and ended without a ready node; ``timeline`` holds the states seen until then."""

    timeline = None


class NotReady(WaitFailed):
    """``timeout`` ran out; ``last`` is the state seen last (``state``, ``detail``)."""

    def __init__(self, message, last):
        super().__init__(message)
        self.last = last


class CloudInitFailed(WaitFailed):
    """cloud-init finished with an error."""


class AgentRefused(WaitFailed):
    """The guest agent will not answer for good: PVE says it is not configured, or the token may not use it."""


class HostKeyRefused(WaitFailed):
    """The node offers a key other than the one the fleet knows for it."""

    def __init__(self, message, known_fingerprint, offered_fingerprint):
        super().__init__(message)
        self.known_fingerprint = known_fingerprint
        self.offered_fingerprint = offered_fingerprint


class HostKeyUnreadable(WaitFailed):
    """ssh-keyscan read no host key from the node."""


class NotTheNode(WaitFailed):
    """The final strict ssh connection failed, or the node's hostname is not its name."""


class KnownHostsConflict(WaitFailed):
    """Another run changed this node's entry in the fleet's known_hosts while this one waited."""


# --------------------------------------------------------------------------------------------------- request


class WaitRequest:
    """The module's parameters, as the waiter needs them (``address`` without its prefix length)."""

    def __init__(self, name, address, private_key_file, known_hosts_file, user="debian", host_key_source="auto",
                 vmid=None, agent_wait=120, pinned_host_key=None, forget_known_key=False, timeout=300, port=22):
        if host_key_source not in HOST_KEY_SOURCES:
            raise ValueError("host_key_source %r is not one of %s" % (host_key_source, ", ".join(HOST_KEY_SOURCES)))
        self.name = name
        self.address = address.split("/")[0]
        self.private_key_file = private_key_file
        self.known_hosts_file = known_hosts_file
        self.user = user
        self.host_key_source = host_key_source
        self.vmid = vmid
        self.agent_wait = agent_wait
        self.pinned_host_key = pinned_host_key
        self.forget_known_key = forget_known_key
        self.timeout = timeout
        self.port = port


def ssh_argv(request, known_hosts, strict, command):
    """One ssh command to the node, its key filed under the node's name; never prompts."""
    options = ["BatchMode=yes", "ConnectTimeout=5", "LogLevel=ERROR", "HostKeyAlias=" + request.name,
               "UserKnownHostsFile=" + known_hosts,
               "StrictHostKeyChecking=" + ("yes" if strict else "no")]
    argv = ["ssh", "-p", str(request.port), "-i", request.private_key_file]
    for option in options:
        argv += ["-o", option]
    return argv + ["{}@{}".format(request.user, request.address), command]


def keyscan_argv(request):
    return ["ssh-keyscan", "-T", "5", "-t", "ed25519", "-p", str(request.port), request.address]


# ---------------------------------------------------------------------------------------------- known_hosts


def read_text(path):
    if not os.path.exists(path):
        return ""
    with open(path) as handle:
        return handle.read()


def known_before_wait(request):
    """(the fleet's file as read, the entries the wait starts from: without this node's after forget_known_key)."""
    original = read_text(request.known_hosts_file)
    known = host_keys.remove_entries(original, request.name) if request.forget_known_key else original
    return original, known


def predict(request):
    """Check mode: from the known_hosts file alone, whether a key would be learned."""
    known = known_before_wait(request)[1]
    # After forgetting, the key is learned again: the file changes unless the very same key comes back.
    action = host_keys.KEEP if request.name in host_keys.parse_known_hosts(known) else host_keys.LEARN
    return dict(changed=action == host_keys.LEARN, host_key_action=action, timeline=[])


def write_text(path, text, atomic_move):
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o600)
    atomic_move(tmp, path)
    os.chmod(path, 0o600)  # Ansible's atomic_move gives a new file the umask's mode (0644)


def record_key(name, path, known_text, settled, atomic_move=os.replace):
    """Write this node's settled entry into the fleet's file; True when the file changed.

    Several nodes may be added at once, each run writing the same file: under an exclusive lock the file is read
    again and only this node's lines are taken from ``settled``, so an entry another run wrote meanwhile is kept.
    KnownHostsConflict when this node's own entry changed meanwhile."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = read_text(path)
        if current != known_text:
            if host_keys.parse_known_hosts(current).get(name) != host_keys.parse_known_hosts(known_text).get(name):
                raise KnownHostsConflict("{}: its entry in {} was changed by another run while this one waited; run "
                                         "again to settle it".format(name, path))
            others = host_keys.remove_entries(current, name)
            if others and not others.endswith("\n"):
                others += "\n"
            mine = [line for line in settled.splitlines(True) if line.split()[:1] == [name]]
            settled = others + "".join(mine)
        if settled == current:
            return False
        write_text(path, settled, atomic_move)
        return True


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
            self.record(state, err if rc == 255 else out)
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
            self.record(state, err if rc == 255 else out)
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
