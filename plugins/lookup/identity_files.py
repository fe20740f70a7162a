# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: identity_files
short_description: The fleet CA and a node's key and certificate as they are on the controller
version_added: 0.1.0
description:
  - Reads the fleet CA directory (C(ca.key), C(ca.crt)) and, with O(node), the node's directory under it
    (C(nodes/NODE/node.key), C(nodes/NODE/node.crt)) in the controller's own process, and says whether anything
    is missing or has another mode than the identity role gives it (directories 0700, keys 0600).
  - Changes nothing. The identity role reads this first and runs community.crypto's modules only when something
    must be made, fixed or issued again, so a re-run on a ready node starts no module for its identity.
  - The certificate's info has the form C(community.crypto.x509_certificate_info) returns, for the parts the role
    reads, so P(llmgw.fleet.certificate_decision#filter) takes either.
author:
  - llmgw.fleet developers (@llmgw)
options:
  _terms:
    description: The fleet CA directory (C(~) is expanded).
    required: true
    type: list
    elements: path
  node:
    description: The node whose key and certificate are read too.
    type: str
  renewal_days:
    description: The certificate's C(valid_at.renewal_window) says whether it is still valid this many days from now.
    type: int
    default: 30
requirements:
  - cryptography (the Python library, on the controller)
"""

EXAMPLES = r"""
- name: Is node05's certificate there and valid for another 30 days?
  ansible.builtin.debug:
    msg: "{{ lookup('llmgw.fleet.identity_files', '~/.local/share/llmgw/ca', node='node05').node_cert.valid_at }}"

- name: Make the CA only when it is not complete
  ansible.builtin.include_role:
    name: llmgw.fleet.identity
    tasks_from: ca.yml
  when: not lookup('llmgw.fleet.identity_files', '~/.local/share/llmgw/ca').ca_complete
"""

RETURN = r"""
_raw:
  description: One answer per directory.
  type: list
  elements: dict
  contains:
    ca_complete:
      description: The CA directory (0700), its key (0600) and its certificate are there.
      type: bool
    node_complete:
      description: The CA is complete, and the node's directory (0700), key (0600) and a readable certificate are there.
      type: bool
    node_cert:
      description:
        - The node's certificate (C(subject.commonName), C(subject_alt_name), C(not_after),
          C(valid_at.renewal_window), C(fingerprints.sha256)), or C(none) when there is none.
      type: dict
    problems:
      description: Why the CA or the node is not complete.
      type: list
      elements: str
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.llmgw.fleet.plugins.module_utils import _identity_files


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        node, days = self.get_option("node"), self.get_option("renewal_days")
        if days is None or days < 0:
            raise AnsibleLookupError("renewal_days must be 0 or more (got {!r})".format(days))
        return [_identity_files.read(str(term), node=node, renewal_days=days) for term in terms]
