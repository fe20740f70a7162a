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

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmgw.fleet.plugins.module_utils._proxmox_args import (
    PROXMOX_REQUIRED_TOGETHER,
    proxmox_argument_spec,
    warn_if_unverified,
)
from ansible_collections.llmgw.fleet.plugins.module_utils.node_wait import (
    HOST_KEY_SOURCES,
    HostKeyRefused,
    NodeWaiter,
    NodeWaitError,
    WaitFailed,
    WaitRequest,
    open_agent,
    predict,
)
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_errors import ProxmoxError

NODE_OPTIONS = dict(
    name=dict(type="str", required=True),
    address=dict(type="str", required=True),
    user=dict(type="str", default="debian"),
    private_key_file=dict(type="path", required=True),
    known_hosts_file=dict(type="path", default="~/.local/share/llmgw/known_hosts"),
    host_key_source=dict(type="str", default="auto", choices=list(HOST_KEY_SOURCES)),
    vmid=dict(type="int"),
    agent_wait=dict(type="int", default=120),
    pinned_host_key=dict(type="str", no_log=False),  # a public key, not a secret
    forget_known_key=dict(type="bool", default=False),
    timeout=dict(type="int", default=300),
    port=dict(type="int", default=22),
)


def main():
    argument_spec = proxmox_argument_spec()
    argument_spec.update(NODE_OPTIONS)
    module = AnsibleModule(argument_spec=argument_spec, required_together=PROXMOX_REQUIRED_TOGETHER,
                           supports_check_mode=True)
    params = module.params
    request = WaitRequest(**{key: params[key] for key in NODE_OPTIONS})
    if module.check_mode:
        module.exit_json(**predict(request))
    warn_if_unverified(module)
    waiter = NodeWaiter(request, module.run_command, module.tmpdir, module.warn, atomic_move=module.atomic_move)
    try:
        result = waiter.run(lambda: open_agent(request, params, os.environ))
    except HostKeyRefused as exc:
        module.fail_json(msg=str(exc), timeline=exc.timeline, known_fingerprint=exc.known_fingerprint,
                         offered_fingerprint=exc.offered_fingerprint)
    except WaitFailed as exc:
        module.fail_json(msg=str(exc), timeline=exc.timeline)
    except NodeWaitError as exc:
        module.fail_json(msg=str(exc))
    except ProxmoxError as exc:
        module.fail_json(msg="{}: reading its VM through the Proxmox API failed: {}".format(request.name, exc),
                         error=type(exc).__name__)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
