# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The bad-input matrix for ``llmgw.fleet.pve_vm``: every option given a malformed value (wrong type, out of range,
empty, a value Proxmox VE's schema refuses, a template or node that is not there, an unknown option, a pair that
contradicts itself), run through the module's ``main()`` against the fake Proxmox client, in check mode and for
real. Each must fail before any write, its message naming the option, the value and the fix.

Proxmox VE would refuse most of these values itself, but only at the call that carries them: after the clone,
leaving a VM half-made. The module refuses them before it connects, or from reads only.
"""

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.llmgw.fleet.plugins.module_utils import vm_fields
from ansible_collections.llmgw.fleet.plugins.module_utils.proxmox_client import ProxmoxClient
from ansible_collections.llmgw.fleet.plugins.modules import pve_vm
from ansible_collections.llmgw.fleet.tests.unit.plugins.module_utils.fake_pve_api import (
    TEMPLATE_NAME,
    FakeProxmoxClient,
)

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE4pI0qvGKY5Ca7z0kk8r3Tqb7FEAPOWcUpCIkHNO2yl fleet@controller"
GOOD = dict(name="node05", address="10.77.0.105/24", gateway="10.77.0.1", clone=TEMPLATE_NAME, ciuser="debian",
            sshkeys=KEY, nameserver="10.77.0.1", state="started", api_host="pve.example", api_user="root@pam",
            api_password="not-used")

# option (the field the message must name), its values, the fragments the message must hold (value and fix)
MATRIX = [
    ("name", {"name": ""}, ["name=''", "is not a DNS name", "letters, digits and hyphens"]),
    ("name", {"name": "node_05"}, ["name='node_05'", "is not a DNS name", "e.g. node05"]),
    ("name", {"name": None}, ["missing required arguments: name"]),
    ("state", {"state": "gone"}, ["state", "gone", "present, started, stopped, absent"]),
    ("address", {"address": "10.77.0.105"}, ["address '10.77.0.105'", "with its prefix length, e.g. 10.77.0.105/24"]),
    ("address", {"address": "10.77.0.0/24"}, ["address 10.77.0.0/24", "network address", "not a host address"]),
    ("address", {"address": "10.77.0.300/24"}, ["address '10.77.0.300/24'", "not an IPv4 address"]),
    ("address", {"address": "10.77.0.5/24", "vmid_base": 0}, ["last octet 5", "below 100", "raise vmid_base"]),
    ("gateway", {"gateway": "10.78.0.1"}, ["gateway 10.78.0.1", "not inside 10.77.0.0/24"]),
    ("gateway", {"gateway": "router"}, ["gateway 'router'", "not an IPv4 address"]),
    ("vmid", {"vmid": 99}, ["vmid 99", "below 100", "pass vmid"]),
    ("vmid", {"vmid": "abc"}, ["vmid", "abc", "int"]),
    ("vmid_base", {"vmid_base": -1}, ["vmid_base -1", "negative"]),
    ("node", {"node": "pve_1"}, ["node='pve_1'", "not a Proxmox VE node name", "pvesh get /nodes"]),
    ("node", {"node": "elsewhere"}, ["node='elsewhere' is not a node of the cluster (pve)", "give one of those"]),
    ("clone", {"clone": ""}, ["clone=''", "is empty", "leave the option out"]),
    ("clone", {"clone": "no-such-template"}, ["no-such-template"]),
    ("full_clone", {"full_clone": "maybe"}, ["full_clone", "maybe", "bool"]),
    ("storage", {"storage": "x"}, ["storage='x'", "storage ID", "pvesm status"]),
    ("pool", {"pool": "gpu pool"}, ["pool='gpu pool'", "pool name", "e.g. llmgw"]),
    ("cpu", {"cpu": "kvm64"}, ["kvm64", "cpu: host", "allow_slow_cpu"]),
    ("allow_slow_cpu", {"allow_slow_cpu": "perhaps"}, ["allow_slow_cpu", "perhaps", "bool"]),
    ("cores", {"cores": 0}, ["cores=0", "below 1", "give 1 or more"]),
    ("cores", {"cores": "four"}, ["cores", "four", "int"]),
    ("memory", {"memory": 8}, ["memory=8", "below 16", "give 16 or more"]),
    ("agent", {"agent": "sometimes"}, ["agent", "sometimes", "bool"]),
    ("onboot", {"onboot": "later"}, ["onboot", "later", "bool"]),
    ("ciuser", {"ciuser": "root user"}, ["ciuser='root user'", "not a user name", "e.g. debian"]),
    ("sshkeys", {"sshkeys": "my laptop key"}, ["sshkeys=", "not an OpenSSH public key", "ssh-keygen"]),
    ("sshkeys", {"sshkeys": [KEY, "ssh-ed25519 not*base64"]}, ["not an OpenSSH public key", "ssh-keygen"]),
    ("nameserver", {"nameserver": "10.77.0.1;reboot"}, ["nameserver=", "neither an IP address nor a DNS name",
                                                        "e.g. 10.77.0.1"]),
    ("searchdomain", {"searchdomain": "lab example!"}, ["searchdomain=", "not a domain name", "e.g. lab.example"]),
    ("cloudinit_storage", {"cloudinit_storage": ""}, ["cloudinit_storage=''", "storage ID"]),
    ("bridge", {"bridge": "vmbr0;reboot"}, ["bridge='vmbr0;reboot'", "not a bridge name", "e.g. vmbr0"]),
    ("reboot_if_needed", {"reboot_if_needed": "x"}, ["reboot_if_needed", "bool"]),
    ("timeout", {"timeout": 0}, ["timeout=0", "below 1", "give 1 or more"]),
    ("shutdown_timeout", {"shutdown_timeout": -1}, ["shutdown_timeout=-1", "below 0", "give 0 or more"]),
    ("an unknown option", {"cpus": 4}, ["Unsupported parameters", "cpus"]),
    ("api_token_id without its secret", {"api_token_id": "root@pam!fleet"},
     ["parameters are required together", "api_token_id, api_token_secret"]),
]


class Exited(Exception):
    def __init__(self, result):
        super().__init__(result)
        self.result = result


def run_module(monkeypatch, cluster, args, check_mode):
    def exit_json(module, **result):
        raise Exited(dict(result, failed=False))

    def fail_json(module, msg, **result):
        raise Exited(dict(result, msg=msg, failed=True))

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
    monkeypatch.setattr(ProxmoxClient, "connect", classmethod(lambda cls, settings: cluster))
    module_args = dict((k, v) for k, v in dict(GOOD, **args).items() if v is not None)
    module_args["_ansible_check_mode"] = check_mode
    with patch_module_args(module_args), pytest.raises(Exited) as caught:
        pve_vm.main()
    return caught.value.result


@pytest.fixture
def cluster():
    fake = FakeProxmoxClient()
    fake.add_template()
    return fake


def test_the_good_input_is_accepted(monkeypatch, cluster):
    """The rows below each change one thing of this input, which the module takes and applies."""
    result = run_module(monkeypatch, cluster, {}, check_mode=False)
    assert not result["failed"] and result["changed"] and result["vmid"] == 1105, result
    assert "clone_vm" in cluster.write_names()


def test_every_option_has_a_row():
    assert {f.name for f in vm_fields.OPTIONS} <= {row[0] for row in MATRIX}


@pytest.mark.parametrize("check_mode", [True, False], ids=["check", "apply"])
@pytest.mark.parametrize("option, args, fragments", MATRIX, ids=["%s=%.40r" % (r[0], list(r[1].values())[0])
                                                                 for r in MATRIX])
def test_a_bad_input_is_refused_before_any_write_naming_option_value_and_fix(monkeypatch, cluster, option, args,
                                                                             fragments, check_mode):
    before = cluster.snapshot()
    result = run_module(monkeypatch, cluster, args, check_mode)
    assert result["failed"], result
    for fragment in fragments:
        assert fragment in result["msg"], (fragment, result["msg"])
    assert cluster.writes == [] and cluster.snapshot() == before
