#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: wait_for_node
short_description: Wait through a new VM's first boot and settle its host key in the fleet's known_hosts
description:
  - Runs on the controller. Tries C(ssh NODE cloud-init status) until cloud-init has finished, riding through the
    refused connections, resets and failed logins of a first boot (cloud-init regenerates host keys and restarts
    sshd in a VM's first minute).
  - Only then reads the host key the node will keep and files it under the node's name in the fleet's own
    known_hosts (ssh's C(HostKeyAlias)). An unknown key is learned; a known key must match; a changed key is refused
    with both fingerprints, the node name and the fix (ssh's accept-new rule).
  - A key read through the hypervisor before any ssh connection (the guest agent) can be passed as O(pinned_host_key);
    the node must then offer exactly that key.
  - Finally connects with strict host key checking and verifies that the node's hostname is its name.
  - On timeout, says what it saw last (no route, refused, banner but authentication failed, cloud-init still running).
version_added: 0.1.0
author: llmgw.fleet developers (@llmgw)
options:
  name:
    description: The node's name, which must also be its hostname. The host key is filed under it.
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
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: partial
    details: Predicts from the known_hosts file alone.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
"""

EXAMPLES = r"""
- name: Wait for node05's first boot and learn the key it keeps
  llmgw.fleet.wait_for_node:
    name: node05
    address: 10.77.0.105/24
    private_key_file: ~/.ssh/llmgw_fleet
    timeout: 300

- name: Wait for a node whose key was read through the guest agent
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
  description: V(learn) (new entry written), V(keep) (the known key matched).
  returned: always
  type: str
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
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmgw.fleet.plugins.module_utils import first_boot, host_keys


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
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o600)
    module.atomic_move(tmp, path)


def wait_until_ready(module, address, timeline):
    params = module.params
    started = time.monotonic()
    deadline = started + params["timeout"]
    while True:
        # Nothing is learned before cloud-init is done: the key offered now may be the one it is about to replace.
        rc, out, err = module.run_command(ssh_argv(params, address, os.devnull, False, "cloud-init status"))
        state = first_boot.classify(rc, out, err)
        timeline.record(time.monotonic() - started, state, err if rc == 255 else out)
        if state == first_boot.READY:
            return time.monotonic() - started
        if state == first_boot.CLOUD_INIT_ERROR:
            long_argv = ssh_argv(params, address, os.devnull, False, "cloud-init status --long")
            _ignored, long_out, _ignored = module.run_command(long_argv)
            module.fail_json(msg="{}: cloud-init finished with an error: {}".format(params["name"], long_out.strip()),
                             timeline=timeline.events)
        if time.monotonic() >= deadline:
            last = timeline.last
            module.fail_json(
                msg="{} ({}) was not ready after {} s; last seen: {}{}".format(
                    params["name"], address, params["timeout"], last["state"],
                    " ({})".format(last["detail"]) if last["detail"] else ""),
                timeline=timeline.events)
        time.sleep(2)


def offered_key(module, address):
    pinned = module.params["pinned_host_key"]
    if pinned:
        return pinned.strip()
    rc, out, err = module.run_command(["ssh-keyscan", "-T", "5", "-t", "ed25519", "-p", str(module.params["port"]),
                                       address])
    keys = [line.split(None, 1)[1] for line in out.splitlines() if line and not line.startswith("#")]
    if rc != 0 or not keys:
        module.fail_json(msg="{}: could not read its host key with ssh-keyscan: {}".format(module.params["name"], err))
    return keys[0]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            address=dict(type="str", required=True),
            user=dict(type="str", default="debian"),
            private_key_file=dict(type="path", required=True),
            known_hosts_file=dict(type="path", default="~/.local/share/llmgw/known_hosts"),
            pinned_host_key=dict(type="str", no_log=False),  # a public key, not a secret
            forget_known_key=dict(type="bool", default=False),
            timeout=dict(type="int", default=300),
            port=dict(type="int", default=22),
        ),
        supports_check_mode=True,
    )
    params = module.params
    name = params["name"]
    address = params["address"].split("/")[0]
    path = params["known_hosts_file"]
    known = read_text(path)
    if params["forget_known_key"]:
        known = host_keys.remove_entries(known, name)
    timeline = first_boot.Timeline()

    if module.check_mode:
        action = host_keys.KEEP if name in host_keys.parse_known_hosts(known) else host_keys.LEARN
        module.exit_json(changed=action == host_keys.LEARN or params["forget_known_key"], host_key_action=action,
                         timeline=[])

    waited = wait_until_ready(module, address, timeline)
    key = offered_key(module, address)
    try:
        action = host_keys.decide(known, name, key, path)
    except host_keys.HostKeyChanged as exc:
        module.fail_json(msg=str(exc), known_fingerprint=exc.known_fingerprint,
                         offered_fingerprint=exc.offered_fingerprint, timeline=timeline.events)
    updated = host_keys.add_entry(known, name, key) if action == host_keys.LEARN else known
    if updated != read_text(path):
        write_text(module, path, updated)

    rc, out, err = module.run_command(ssh_argv(params, address, path, True, "hostname"))
    if rc != 0:
        module.fail_json(msg=f"{name}: strict ssh with the fleet's known_hosts failed: {err.strip()}",
                         timeline=timeline.events)
    if out.strip() != name:
        module.fail_json(msg=f"the VM named {name} calls itself {out.strip()!r}: its hostname must be its name",
                         timeline=timeline.events)
    module.exit_json(changed=updated != known or params["forget_known_key"], host_key_action=action,
                     host_key_fingerprint=host_keys.fingerprint(key), waited_s=round(waited, 1),
                     timeline=timeline.events)


if __name__ == "__main__":
    main()
