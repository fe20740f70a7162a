# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""pve_vm's option checks let through what Proxmox VE accepts (the refusals are the bad-input table,
tests/unit/plugins/modules/test_pve_vm_bad_inputs.py)."""

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils import _vm_option_checks as checks

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE4pI0qvGKY5Ca7z0kk8r3Tqb7FEAPOWcUpCIkHNO2yl fleet@controller"


@pytest.mark.parametrize("check, value", [
    (checks.dns_name, "node05"),
    (checks.dns_name, "node05.fleet.example"),
    (checks.dns_name, "Node-05"),
    (checks.node_name, "pve"),
    (checks.node_name, "pve-2"),
    (checks.storage_id, "local-lvm"),
    (checks.storage_id, "ceph_rbd.1"),
    (checks.bridge_id, "vmbr0"),
    (checks.bridge_id, "vmbr0.100"),
    (checks.pool_id, "llmgw"),
    (checks.pool_id, "fleet/gpu"),
    (checks.user_name, "debian"),
    (checks.user_name, "ops_1"),
    (checks.addresses, "10.77.0.1"),
    (checks.addresses, "10.77.0.1 10.77.0.2"),
    (checks.addresses, ["10.77.0.1", "fd00::1", "dns.fleet.example"]),
    (checks.addresses, ""),
    (checks.domains, "fleet.example.internal"),
    (checks.domains, ["a.example", "b.example"]),
    (checks.public_keys, KEY),
    (checks.public_keys, [KEY, "# a comment", ""]),
    (checks.public_keys, 'from="10.77.0.0/24" ' + KEY),
    (checks.public_keys, "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTY= ops"),
    (checks.public_keys, "sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29t yubikey"),
    (checks.public_keys, "ssh-ed25519-cert-v01@openssh.com AAAAIHNzaC1lZDI1NTE5LWNlcnQtdjAxQG9wZW5zc2guY29t x"),
    (checks.public_keys, ""),
    (checks.at_least(1, "cores", 4), 1),
    (checks.at_least(0, "seconds", 120), 0),
    (checks.not_empty, "debian-12-template"),
])
def test_a_value_proxmox_accepts_passes(check, value):
    assert check(value) is None
