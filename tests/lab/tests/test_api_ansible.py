"""community.proxmox's proxmox_kvm (bundled with ansible) talks to the lab unchanged, verifying its CA.

The module has no CA option; with `validate_certs: true` proxmoxer's requests backend honours
REQUESTS_CA_BUNDLE, which is how the lab's CA reaches it.
"""

import json
import os
import subprocess
import sys

PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  module_defaults:
    community.proxmox.proxmox_kvm:
      api_host: "{{ lab.api_host }}"
      api_port: "{{ lab.api_port }}"
      api_user: "{{ lab.api_user }}"
      api_token_id: "{{ lab.api_token_name }}"
      api_token_secret: "{{ lab.api_token_secret }}"
      validate_certs: true
      node: "{{ lab.pve_node }}"
  tasks:
    - name: Clone the lab's template
      community.proxmox.proxmox_kvm:
        clone: "{{ lab.template_name }}"
        newid: "{{ newid }}"
        name: from-ansible
        full: false
        timeout: 120
      register: cloned
    - name: Read its state
      community.proxmox.proxmox_kvm:
        vmid: "{{ newid }}"
        state: current
      register: current
    - name: Both worked as on a real Proxmox VE
      ansible.builtin.assert:
        that:
          - cloned is changed
          - current.status == "stopped"
"""


def test_proxmox_kvm_clones_from_the_lab(tmp_path, conn, node, vms):
    newid = vms.track(vms.free_id())
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "vars.json").write_text(json.dumps({"lab": conn, "newid": newid}))
    env = dict(os.environ, REQUESTS_CA_BUNDLE=str(conn["ca_cert"]), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False")
    result = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", "ansible_python_interpreter=" + sys.executable, "-e", "@" + str(tmp_path / "vars.json"),
         str(tmp_path / "play.yml")], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert node.qemu(newid).config.get()["name"] == "from-ansible"
