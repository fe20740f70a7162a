#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: wait_for_node
short_description: Wait through a new VM's first boot and settle its host key in the fleet's known_hosts
description:
  - Runs on the controller. Waits until the node is really ready (cloud-init has finished, ssh answers with the host
    key the node will keep), riding through the refused connections, resets and failed logins of a first boot
    (cloud-init may regenerate host keys and restart sshd in a VM's first minute), bounded by O(timeout).
  - "Where the host key comes from (O(host_key_source)): through the hypervisor, before any ssh connection, or over
    ssh once cloud-init is done."
  - "V(agent): asks the QEMU guest agent, through the Proxmox VE API, for C(cloud-init status) until it is done,
    then reads C(/etc/ssh/ssh_host_ed25519_key.pub) the same way and pins it: the first ssh connection already
    requires that key. This is better than accept-new, since no key is ever taken from the network on trust."
  - "V(ssh): tries C(ssh NODE cloud-init status) (not checking the key, learning nothing) until cloud-init is done,
    and only then reads the key the node offers (accept-new: the key cloud-init was about to replace is never
    learned)."
  - "V(auto) (the default) uses the agent when it can: the Proxmox connection options are given (for example by
    C(module_defaults) for C(group/llmgw.fleet.proxmox)), a VM of that name exists and its config enables the
    agent. If the agent has not answered once within O(agent_wait) seconds, or the API refuses its use (permission),
    it falls back to V(ssh), with a warning."
  - The key is filed under the node's name in the fleet's own known_hosts (ssh's C(HostKeyAlias)). An unknown key is
    learned; a known key must match; a changed key is refused with both fingerprints, the node name and the fix.
    With the agent, a changed key is refused before any ssh connection is made.
  - A key read elsewhere can be passed as O(pinned_host_key); it is treated like a key read through the agent.
  - Finally connects with strict host key checking against the fleet's file as it is to be written and verifies that
    the node's hostname is its name; only then is the file written, so a failed wait leaves it as it was.
  - On timeout, says what it saw last (no route, refused, banner but authentication failed, host key other than the
    pinned one, cloud-init still running, the VM not running, the guest agent not answering).
version_added: 0.1.0
author: llmgw.fleet developers (@llmgw)
extends_documentation_fragment:
  - llmgw.fleet.attributes
  - llmgw.fleet.proxmox
  - llmgw.fleet.proxmox.ACTIONGROUP_PROXMOX
options:
  name:
    description: The node's name, which must also be its hostname (and, for the agent, its VM name). The host key is
      filed under it.
    type: str
    required: true
  address:
    description: The node's IPv4 address; a prefix length (V(10.77.0.105/24)) is accepted and ignored.
    type: str
    required: true
  user:
    description: The user cloud-init created (the VM's C(ciuser)).
    type: str
    default: debian
  private_key_file:
    description: The private key whose public half is in the VM's C(sshkeys).
    type: path
    required: true
  known_hosts_file:
    description: The fleet's known_hosts file.
    type: path
    default: ~/.local/share/llmgw/known_hosts
  host_key_source:
    description:
      - Where the host key is read, see the description. V(agent) needs the Proxmox connection options and a VM
        whose config enables the agent (C(agent=1)), and fails otherwise; V(auto) then uses V(ssh).
      - Ignored when O(pinned_host_key) is given.
    type: str
    choices: [auto, agent, ssh]
    default: auto
  vmid:
    description: The node's VMID, for the agent. Found by O(name) among the cluster's VMs when not given.
    type: int
  agent_wait:
    description: With O(host_key_source=auto), seconds to wait for a first answer of the guest agent before using
      V(ssh) instead. A permission error of the API falls back at once.
    type: int
    default: 120
  pinned_host_key:
    description: The host key (C(TYPE BASE64)) read through the hypervisor; when set, no other key is accepted.
    type: str
  forget_known_key:
    description: Remove the entry filed under O(name) first. Only for a node that was deliberately rebuilt.
    type: bool
    default: false
  timeout:
    description: Seconds to wait for the node to become ready.
    type: int
    default: 300
  port:
    description: The node's ssh port.
    type: int
    default: 22
notes:
  - In check mode nothing is contacted; the result says whether a key would be learned.
  - The Proxmox connection options matter only for the guest agent; without them (and without the C(PROXMOX_*)
    environment variables) O(host_key_source=auto) uses ssh and proxmoxer is not needed.
  - The agent's C(file-read) is used where the API has it, C(exec) of C(cat) otherwise.
attributes:
  check_mode:
    support: partial
    details: Predicts from the known_hosts file alone.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Wait for node05's first boot and learn the key it keeps (agent if configured, else ssh)
  llmgw.fleet.wait_for_node:
    name: node05
    address: 10.77.0.105/24
    private_key_file: ~/.ssh/llmgw_fleet
    timeout: 300

- name: Pin the host key read through the guest agent before the first ssh connection
  llmgw.fleet.wait_for_node:
    api_host: pve.example.com
    api_token_id: ansible@pve!fleet
    api_token_secret: "{{ vault_pve_token_secret }}"
    ca_path: /etc/llmgw/pve-ca.pem
    name: node05
    address: 10.77.0.105
    vmid: 1105
    private_key_file: ~/.ssh/llmgw_fleet
    host_key_source: agent

- name: Wait for a node whose key was read elsewhere
  llmgw.fleet.wait_for_node:
    name: node05
    address: 10.77.0.105
    private_key_file: ~/.ssh/llmgw_fleet
    pinned_host_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE4pI0qvGKY5Ca7z0kk8r3Tqb7FEAPOWcUpCIkHNO2yl"
"""

RETURN = r"""
host_key_fingerprint:
  description: SHA256 fingerprint of the node's ed25519 host key.
  returned: success, not in check mode
  type: str
  sample: SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s
host_key_action:
  description: V(learn) (new entry written), V(keep) (the known key matched); in check mode, the prediction.
  returned: success
  type: str
host_key_source:
  description: Where the key came from, V(agent), V(ssh) or V(pinned) (O(pinned_host_key)).
  returned: success, not in check mode
  type: str
  sample: agent
host_key_source_reason:
  description: Why V(auto) used V(ssh) (no Proxmox connection options, no VM of that name, no agent configured, the
    agent could not be used); empty otherwise.
  returned: success, not in check mode
  type: str
  sample: no Proxmox connection options
waited_s:
  description: Seconds from the first attempt until the node was ready.
  returned: success, not in check mode
  type: float
timeline:
  description: The distinct states seen on the way, each with the second at which it began.
  returned: always
  type: list
  elements: dict
  sample: [{"after_s": 0.0, "state": "connection refused (sshd not listening yet, or restarting)", "detail": ""}]
known_fingerprint:
  description: On a refused changed key, the fingerprint the fleet knows.
  returned: failure, when the host key changed
  type: str
offered_fingerprint:
  description: On a refused changed key, the fingerprint the node now has.
  returned: failure, when the host key changed
  type: str
"""

import fcntl
import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmgw.fleet.plugins.module_utils import first_boot, host_keys
from ansible_collections.llmgw.fleet.plugins.module_utils._proxmox_args import (
    PROXMOX_REQUIRED_TOGETHER,
    proxmox_argument_spec,
    warn_if_unverified,
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

HOST_KEY_FILE = "/etc/ssh/ssh_host_ed25519_key.pub"
POLL_S = 2


def ssh_argv(params, address, known_hosts, strict, command):
    options = ["BatchMode=yes", "ConnectTimeout=5", "LogLevel=ERROR", "HostKeyAlias=" + params["name"],
               "UserKnownHostsFile=" + known_hosts,
               "StrictHostKeyChecking=" + ("yes" if strict else "no")]
    argv = ["ssh", "-p", str(params["port"]), "-i", params["private_key_file"]]
    for option in options:
        argv += ["-o", option]
    return argv + ["{}@{}".format(params["user"], address), command]


def read_text(path):
    if not os.path.exists(path):
        return ""
    with open(path) as handle:
        return handle.read()


def write_text(module, path, text):
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o600)
    module.atomic_move(tmp, path)
    os.chmod(path, 0o600)  # atomic_move gives a new file the umask's mode (0644)


def record_key(wait, path, known_text, settled):
    """Write this node's settled entry into the fleet's file; True when the file changed.

    Several nodes may be added at once, each run writing the same file: under an exclusive lock the file is read
    again and only this node's lines are taken from ``settled``, so an entry another run wrote meanwhile is kept."""
    name = wait.name
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = read_text(path)
        if current != known_text:
            if host_keys.parse_known_hosts(current).get(name) != host_keys.parse_known_hosts(known_text).get(name):
                wait.fail("{}: its entry in {} was changed by another run while this one waited; run again to "
                          "settle it".format(name, path))
            others = host_keys.remove_entries(current, name)
            if others and not others.endswith("\n"):
                others += "\n"
            mine = [line for line in settled.splitlines(True) if line.split()[:1] == [name]]
            settled = others + "".join(mine)
        if settled == current:
            return False
        write_text(wait.module, path, settled)
        return True


class Wait:
    """One wait for one node: the deadline, the timeline, and failing with what was seen last."""

    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.name = module.params["name"]
        self.address = module.params["address"].split("/")[0]
        self.timeline = first_boot.Timeline()
        self.started = time.monotonic()
        self.deadline = self.started + module.params["timeout"]

    def elapsed(self):
        return time.monotonic() - self.started

    def record(self, state, detail=""):
        self.timeline.record(self.elapsed(), state, detail)

    def fail(self, msg, **extra):
        self.module.fail_json(msg=msg, timeline=self.timeline.events, **extra)

    def fail_if_out_of_time(self):
        if time.monotonic() >= self.deadline:
            self.fail(first_boot.timeout_message(self.name, self.address, self.params["timeout"],
                                                 self.timeline.last))

    def ssh(self, known_hosts, strict, command):
        return self.module.run_command(ssh_argv(self.params, self.address, known_hosts, strict, command))


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


def open_agent(module):
    """(GuestAgent, None), or (None, why not) when V(auto) is to use ssh; fails where V(agent) cannot be had."""
    params = module.params
    wanted = params["host_key_source"] == "agent"
    if not HAS_PROXMOXER:
        if wanted:
            module.fail_json(msg="host_key_source=agent needs proxmoxer (pip install proxmoxer requests)")
        return None, "proxmoxer is not installed"
    try:
        warn_if_unverified(module)
        settings = settings_from_params(params, os.environ)
    except ProxmoxError as exc:
        if wanted:
            module.fail_json(msg="host_key_source=agent needs the Proxmox connection options: {}".format(exc))
        return None, "no Proxmox connection options"
    try:
        client = ProxmoxClient.connect(settings)
        vms = [vm for vm in client.qemu_vms() if not vm["template"]]
        if params["vmid"] is not None:
            matches = [vm for vm in vms if vm["vmid"] == params["vmid"]]
        else:
            matches = [vm for vm in vms if vm.get("name") == params["name"]]
        if not matches and not wanted and params["vmid"] is None:
            return None, "no VM named {} in the cluster".format(params["name"])
        if len(matches) != 1:
            found = ", ".join("{} ({})".format(vm.get("name"), vm["vmid"]) for vm in matches) or "none"
            wanted_vm = params["vmid"] or "named " + params["name"]
            module.fail_json(msg="{}: cannot tell which VM to ask through the guest agent (VM {}: {}); give vmid, "
                             "or host_key_source=ssh".format(params["name"], wanted_vm, found))
        vm = matches[0]
        if vm.get("name") != params["name"]:
            module.fail_json(msg="VM {} is called {}, not {}: wrong vmid?".format(
                vm["vmid"], vm.get("name"), params["name"]))
        config = client.vm_config(vm["node"], vm["vmid"])
    except ProxmoxError as exc:
        module.fail_json(msg="{}: reading its VM through the Proxmox API failed: {}".format(params["name"], exc),
                         error=type(exc).__name__)
    if not agent_enabled(config.get("agent")):
        if wanted:
            module.fail_json(msg="{} (VM {}) has no guest agent configured (agent: 1): use host_key_source=ssh, or "
                             "enable the agent".format(params["name"], vm["vmid"]))
        return None, "the VM's config does not enable the guest agent"
    return GuestAgent(client, vm["node"], vm["vmid"]), None


def key_through_agent(wait, agent, give_up_after):
    """The host key read through the agent once cloud-init is done; None when the agent has not answered once
    within ``give_up_after`` seconds (V(auto) then uses ssh)."""
    answered = False
    while True:
        try:
            result = agent.run(["cloud-init", "status"])
            answered = True
            state = first_boot.classify_agent_status(result["exitcode"], result["out"])
            wait.record(state, result["out"] if state == first_boot.UNKNOWN else "")
            if state == first_boot.AGENT_READY:
                return agent.host_key()
            if state == first_boot.CLOUD_INIT_ERROR:
                long_status = agent.run(["cloud-init", "status", "--long"])["out"]
                wait.fail("{}: cloud-init finished with an error: {}".format(wait.name, long_status.strip()))
        except AgentNotConfigured as exc:
            wait.fail("{}: {}".format(wait.name, exc))
        except PermissionDenied as exc:
            wait.record(first_boot.AGENT_FAILED, str(exc))
            if give_up_after is not None:
                return None  # the token may not use the agent: waiting would not change that
            wait.fail("{}: the API token or user may not use the guest agent: {}".format(wait.name, exc))
        except VMNotRunning:
            wait.record(first_boot.VM_NOT_RUNNING)
        except AgentNotRunning:
            wait.record(first_boot.AGENT_NOT_ANSWERING)
        except (ProxmoxError, host_keys.BadPublicKey) as exc:
            answered = answered or isinstance(exc, (Timeout, host_keys.BadPublicKey))
            wait.record(first_boot.AGENT_FAILED, str(exc))
        if not answered and give_up_after is not None and wait.elapsed() >= give_up_after:
            return None
        wait.fail_if_out_of_time()
        time.sleep(POLL_S)


def settle(wait, known, key):
    """LEARN or KEEP for ``key``; fails with both fingerprints, the node and the fix when it changed."""
    try:
        return host_keys.decide(known, wait.name, key, wait.params["known_hosts_file"])
    except host_keys.HostKeyChanged as exc:
        wait.fail(str(exc), known_fingerprint=exc.known_fingerprint, offered_fingerprint=exc.offered_fingerprint)


def ready_with_pinned_key(wait, known, key, agent):
    """Waits until ssh, requiring ``key`` from the first connection on, says cloud-init is done; returns the key
    (re-read through the agent if the node changed it meanwhile)."""
    pinned_file = os.path.join(wait.module.tmpdir, "pinned_known_hosts")
    while True:
        with open(pinned_file, "w") as handle:
            handle.write(host_keys.known_hosts_line(wait.name, key))
        rc, out, err = wait.ssh(pinned_file, True, "cloud-init status")
        state = first_boot.classify(rc, out, err)
        wait.record(state, err if rc == 255 else out)
        if state == first_boot.READY:
            return key
        if state == first_boot.CLOUD_INIT_ERROR:
            wait.fail("{}: cloud-init finished with an error: {}".format(wait.name, out.strip()))
        if state == first_boot.KEY_CHANGED and agent is not None:
            try:
                fresh = agent.host_key()
            except (ProxmoxError, host_keys.BadPublicKey) as exc:
                wait.record(first_boot.AGENT_FAILED, str(exc))
            else:
                if fresh != key:
                    key = fresh
                    settle(wait, known, key)
        wait.fail_if_out_of_time()
        time.sleep(POLL_S)


def ready_over_ssh(wait):
    """Waits until ``cloud-init status`` over ssh (key not checked, nothing learned) is done; returns the key the
    node then offers."""
    while True:
        # Nothing is learned before cloud-init is done: the key offered now may be the one it is about to replace.
        rc, out, err = wait.ssh(os.devnull, False, "cloud-init status")
        state = first_boot.classify(rc, out, err)
        wait.record(state, err if rc == 255 else out)
        if state == first_boot.READY:
            break
        if state == first_boot.CLOUD_INIT_ERROR:
            _rc, long_out, _err = wait.ssh(os.devnull, False, "cloud-init status --long")
            wait.fail("{}: cloud-init finished with an error: {}".format(wait.name, long_out.strip()))
        wait.fail_if_out_of_time()
        time.sleep(POLL_S)
    rc, out, err = wait.module.run_command(["ssh-keyscan", "-T", "5", "-t", "ed25519", "-p",
                                            str(wait.params["port"]), wait.address])
    keys = [line.split(None, 1)[1] for line in out.splitlines() if line and not line.startswith("#")]
    if rc != 0 or not keys:
        wait.fail("{}: could not read its host key with ssh-keyscan: {}".format(wait.name, err))
    return keys[0]


def main():
    argument_spec = proxmox_argument_spec()
    argument_spec.update(
        name=dict(type="str", required=True),
        address=dict(type="str", required=True),
        user=dict(type="str", default="debian"),
        private_key_file=dict(type="path", required=True),
        known_hosts_file=dict(type="path", default="~/.local/share/llmgw/known_hosts"),
        host_key_source=dict(type="str", default="auto", choices=["auto", "agent", "ssh"]),
        vmid=dict(type="int"),
        agent_wait=dict(type="int", default=120),
        pinned_host_key=dict(type="str", no_log=False),  # a public key, not a secret
        forget_known_key=dict(type="bool", default=False),
        timeout=dict(type="int", default=300),
        port=dict(type="int", default=22),
    )
    module = AnsibleModule(argument_spec=argument_spec, required_together=PROXMOX_REQUIRED_TOGETHER,
                           supports_check_mode=True)
    params = module.params
    name = params["name"]
    path = params["known_hosts_file"]
    original = read_text(path)
    known = host_keys.remove_entries(original, name) if params["forget_known_key"] else original

    if module.check_mode:
        # After forgetting, the key is learned again: the file changes unless the very same key comes back.
        action = host_keys.KEEP if name in host_keys.parse_known_hosts(known) else host_keys.LEARN
        module.exit_json(changed=action == host_keys.LEARN, host_key_action=action, timeline=[])

    wait = Wait(module)
    key, source, agent, why_not = None, "ssh", None, None
    if params["pinned_host_key"]:
        try:
            key, source = host_keys.public_key(params["pinned_host_key"], keytype=None), "pinned"
        except host_keys.BadPublicKey as exc:
            module.fail_json(msg="pinned_host_key: {}".format(exc))
    elif params["host_key_source"] != "ssh":
        agent, why_not = open_agent(module)
        if agent is not None:
            give_up = params["agent_wait"] if params["host_key_source"] == "auto" else None
            key = key_through_agent(wait, agent, give_up)
            if key is None:
                last = wait.timeline.last
                why_not = "the guest agent could not be used: " + last["state"]
                module.warn("{}: the guest agent could not be used within {} s (last seen: {}{}); the host key is "
                            "learned over ssh after cloud-init instead".format(
                                name, params["agent_wait"], last["state"],
                                " ({})".format(last["detail"]) if last["detail"] else ""))
            else:
                source = "agent"
    if key is not None:
        settle(wait, known, key)  # a changed key is refused before any ssh connection
        key = ready_with_pinned_key(wait, known, key, agent if source == "agent" else None)
    else:
        key = ready_over_ssh(wait)
    waited = wait.elapsed()
    action = settle(wait, known, key)
    updated = host_keys.add_entry(known, name, key) if action == host_keys.LEARN else known
    # The fleet's file is written only once the node proved, over strict ssh, that it is the one named.
    candidate = os.path.join(module.tmpdir, "fleet_known_hosts")
    with open(candidate, "w") as handle:
        handle.write(updated)
    rc, out, err = wait.ssh(candidate, True, "hostname")
    if rc != 0:
        wait.fail(f"{name}: strict ssh with the fleet's known_hosts failed: {err.strip()}")
    if out.strip() != name:
        wait.fail(f"the VM named {name} calls itself {out.strip()!r}: its hostname must be its name")
    changed = record_key(wait, path, known_text=original, settled=updated)
    module.exit_json(changed=changed, host_key_action=action,
                     host_key_source=source, host_key_source_reason=why_not or "",
                     host_key_fingerprint=host_keys.fingerprint(key),
                     waited_s=round(waited, 1), timeline=wait.timeline.events)


if __name__ == "__main__":
    main()
